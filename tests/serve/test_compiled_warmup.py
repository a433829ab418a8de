"""A compiled service compiles in its warm-up, before /readyz says ready, and never on a request: after the warm-up a
batch of any size runs graphs compiled already (stylevar.runtime.compile, on the eager backend here)."""
from __future__ import annotations

import pytest
import torch
from PIL import Image

from serve.engine.batching import Job
from serve.engine.runner import ModelRunner, RunnerOptions, StylizeTask
from stylevar.pipelines.request import StylizeRequest
from stylevar.runtime.compile import compiled
from stylevar.runtime.inference import InferenceConfig

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # tracing: about ten seconds


def _jobs(runner: ModelRunner, rows: int, seed: int) -> list[Job]:
    img = Image.new("RGB", (40, 40), (20 * seed % 255, 90, 160))
    stylization = runner.pipe.prepare(StylizeRequest(seed=seed), img, img, max_side=64)
    return [Job(key=stylization.key, rows=1, payload=StylizeTask(stylization), deadline=float("inf"))
            for _ in range(rows)]


def test_no_graph_is_compiled_on_a_request_after_the_warm_up(micro_model_dir):
    options = RunnerOptions(inference=InferenceConfig(compile=True, compile_backend="eager"))
    runner = ModelRunner.load(micro_model_dir, torch.device("cpu"), options)
    count = compiled(runner.pipe.model)
    assert count is not None and count.graphs == 0
    runner.warmup()
    warmed = count.graphs
    assert warmed > 0
    for rows in (1, 3, 8, 2):
        images = runner.run(_jobs(runner, rows, seed=rows))
        assert len(images) == rows
    assert count.graphs == warmed, f"{count.graphs - warmed} graphs compiled on requests"
