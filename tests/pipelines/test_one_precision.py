"""One precision on every surface: with the bf16 precision (STYLEVAR_PRECISION=bf16, --precision bf16, `prepare`) and
a GPU's autocast ("auto" is bf16 autocast on CUDA; made so on the CPU here), the service, the command line and the
Python call give the same picture for one seed. The service made its conditions outside the model's autocast (float32)
while `generate` made them under it, with the tokenizer under bf16 autocast: a GPU gave two pictures for one seed."""
from __future__ import annotations

import base64

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image

import serve.engine.runner
import stylevar.pipelines.pipeline
from serve.http.app import create_app
from serve.settings import ServeSettings
from stylevar import StyleMix, StylePipeline, cli
from stylevar.loaders.model_dir import DEMO_MODEL_DIR
from stylevar.pipelines.request import StylizeRequest
from stylevar.runtime.inference import InferenceConfig, prepare
from stylevar.utils.precision import resolve_autocast_dtype
from tests.pipelines.test_one_request import pixels, png
from web.client import form_fields

VALUES = dict(seed=7, num_samples=4, guidance=0.5)
FLAGS = ["--seed", "7", "--num-samples", "4", "--guidance", "0.5", "--max-size", "256"]
CONTENT = Image.fromarray(np.random.default_rng(3).integers(0, 256, (30, 44, 3), dtype=np.uint8), "RGB")
STYLE = Image.fromarray(np.random.default_rng(4).integers(0, 256, (20, 20, 3), dtype=np.uint8), "RGB")


@pytest.fixture
def gpu_autocast(monkeypatch):
    """"auto" resolved as on a CUDA device: bf16 autocast (on the CPU "auto" is float32)."""
    def as_on_cuda(name, device):
        return torch.bfloat16 if name == "auto" else resolve_autocast_dtype(name, device)

    monkeypatch.setattr(stylevar.pipelines.pipeline, "resolve_autocast_dtype", as_on_cuda)
    monkeypatch.setattr(serve.engine.runner, "resolve_autocast_dtype", as_on_cuda)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_the_service_the_cli_and_the_python_call_give_one_picture_in_bf16(gpu_autocast, monkeypatch, tmp_path):
    """The demo model (trained: its pictures move with its conditions; a random model's rarely do). The service's
    conditions come through its condition cache (`stylevar.pipelines.conditions`), as by default.

    On one thread: with two (the same count on every surface), oneDNN's bf16 kernels gave the service's picture
    and the library's a few different tokens here, while each surface repeated its own picture exactly (docs/gpus.md,
    "What a seed reproduces")."""
    monkeypatch.setenv("STYLEVAR_PRECISION", "bf16")
    settings = ServeSettings(model_dir=DEMO_MODEL_DIR, device=["cpu"], ui=False, warmup=False, max_output_side=256)
    assert settings.precision == "bf16"
    with TestClient(create_app(settings)) as http:
        r = http.post("/stylize", files={"content": ("c.png", png(CONTENT), "image/png"),
                                         "style": ("s.png", png(STYLE), "image/png")},
                      data=form_fields(StylizeRequest.of(**VALUES)), headers={"Accept": "application/json"})
        assert r.status_code == 200, r.text
        assert http.app.state.service.runner.pipe.model.autocast_dtype == torch.bfloat16
    served = [pixels(base64.b64decode(im["data"])).tolist() for im in r.json()["images"]]

    pipe = StylePipeline.from_pretrained(DEMO_MODEL_DIR, device="cpu")
    prepare(pipe.model, InferenceConfig(precision="bf16"))
    assert [np.asarray(im).tolist() for im in pipe(CONTENT, StyleMix.of(STYLE), max_side=256, **VALUES)] == served

    CONTENT.save(tmp_path / "c.png")
    STYLE.save(tmp_path / "s.png")
    assert cli.main(["stylize", str(tmp_path / "c.png"), str(tmp_path / "s.png"), "-o", str(tmp_path / "o.png"),
                     *FLAGS, "--model", str(DEMO_MODEL_DIR), "--precision", "bf16"]) == 0
    assert [pixels((tmp_path / f"o-seed-{s}.png").read_bytes()).tolist() for s in (7, 8, 9, 10)] == served
