"""`stylevar bench --naive` compares the two sampling loops under one autocast: on CUDA the fast loop opens bf16
autocast for itself, and the naive loop timed outside it ran in fp32 (issue 60, point 8). CPU autocast stands in."""
from __future__ import annotations

import torch

from stylevar.models.transformer import naive
from stylevar.runtime import bench


def _autocast_state() -> tuple[bool, torch.dtype | None]:
    on = torch.is_autocast_enabled("cpu")
    return on, torch.get_autocast_dtype("cpu") if on else None


def test_naive_and_fast_loops_run_under_the_same_autocast(micro_pipeline, monkeypatch):
    model = micro_pipeline.model
    seen: dict[str, tuple[bool, torch.dtype | None]] = {}
    fast_loop, naive_loop = model._sample_tokens, naive.naive_sample_tokens

    def recording(key, loop):
        def run(*args, **kwargs):
            seen[key] = _autocast_state()
            return loop(*args, **kwargs)
        return run

    monkeypatch.setattr(model, "_sample_tokens", recording("fast", fast_loop))
    monkeypatch.setattr(naive, "naive_sample_tokens", recording("naive", naive_loop))
    monkeypatch.setattr(model, "autocast_dtype", torch.bfloat16)  # what `bench` sets on CUDA
    cfg = bench.BenchConfig(repeats=1, warmup=0, naive=True)
    run = bench._Bench(cfg, model, torch.device("cpu"), micro_pipeline.image_size, torch.Generator().manual_seed(0),
                       lambda line: None)
    out = bench._time_naive(run)
    assert out["naive_ms_per_image"] > 0 and out["fast_ms_per_image"] > 0
    assert seen["fast"] == (True, torch.bfloat16)
    assert seen["naive"] == seen["fast"]
