"""One request through every surface: the Python call, the command line, the service's form (the real app), the UI's
handler, the video route and the UI's video tab build the same `StylizeRequest` (a clip's: its fields), resolved once (one `GenerationConfig` per request),
and give the same image; a value the form refuses with 422 the Python call refuses with the same message."""
from __future__ import annotations

import inspect
import io
from collections.abc import Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from serve.http.app import create_app
from serve.http.routes.video import VideoForm
from serve.settings import ServeSettings
from stylevar import StyleMix, StylePipeline, cli
from stylevar.cli.stylize import stylize_request
from stylevar.config import GenerationConfig
from stylevar.pipelines.request import IMAGE_ONLY, StylizeRequest
from web.client import Result, ResultImage, VideoResult, form_fields
from web.ui import StyleVARUI, UIConfig
from web.video_tab import VideoTab

VALUES = dict(style_strength=0.25, seed=11, top_k=40, top_p=0.8, num_samples=2, resize="pad", preserve_color=True,
              upsample="bicubic", guidance=0.5, fast=True)
FLAGS = ["--style-strength", "0.25", "--seed", "11", "--top-k", "40", "--top-p", "0.8", "--num-samples", "2",
         "--resize", "pad", "--preserve-color", "--upsample", "bicubic", "--guidance", "0.5", "--fast"]
CONTENT = Image.fromarray(np.random.default_rng(1).integers(0, 256, (30, 44, 3), dtype=np.uint8), "RGB")
STYLE = Image.fromarray(np.random.default_rng(2).integers(0, 256, (20, 20, 3), dtype=np.uint8), "RGB")


def png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


@pytest.fixture(scope="module")
def http(micro_model_dir) -> Iterator[TestClient]:
    settings = ServeSettings(model_dir=micro_model_dir, device=["cpu"], ui=False, warmup=False, max_output_side=256)
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture
def recorded(monkeypatch) -> dict[str, list]:
    """Every request `StylePipeline.prepare` resolves and every `GenerationConfig` built, while the test runs."""
    seen: dict[str, list] = {"requests": [], "configs": []}
    prepare, init = StylePipeline.prepare, GenerationConfig.__init__

    def recording_prepare(self, request, *args, **kwargs):
        seen["requests"].append(request)
        return prepare(self, request, *args, **kwargs)

    def counting_init(self, *args, **kwargs):
        seen["configs"].append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(StylePipeline, "prepare", recording_prepare)
    monkeypatch.setattr(GenerationConfig, "__init__", counting_init)
    return seen


class RecordingClient:
    def __init__(self):
        self.options: list[StylizeRequest] = []

    def stylize_stream(self, content, style, options: StylizeRequest, masks=None):
        self.options.append(options)
        yield Result("fake", 1, 1.0, [ResultImage(1, Image.open(content).convert("RGB"), b"", "image/png")])

    def stylize_video(self, video, style, options: StylizeRequest, masks=None, temporal=None, timeout_s=900.0):
        self.options.append(options)
        return VideoResult(b"", "fake", options.seed or 0, 1, 1.0, 1.0, temporal or "", False)


def test_every_surface_builds_the_same_request(tmp_path, monkeypatch):
    python = StylePipeline.request("StylePipeline", VALUES)
    parser = cli.build_parser(["stylize"])
    args = parser.parse_args(["stylize", "c.png", "s.png", "-o", "o.png", *FLAGS])
    assert stylize_request(args, format="png") == python
    from serve.http.schemas import StylizeForm

    assert StylizeForm(**form_fields(python)).request() == python
    video = VideoForm(**{k: v for k, v in form_fields(python).items() if k not in IMAGE_ONLY}).request()
    assert video == python.model_copy(update={k: StylizeRequest.model_fields[k].default for k in IMAGE_ONLY})
    CONTENT.save(tmp_path / "c.png")
    STYLE.save(tmp_path / "s.png")
    client = RecordingClient()
    ui = StyleVARUI(UIConfig(api_url="http://127.0.0.1:9"), client=client, baselines=())
    controls = {**VALUES, "seed": 11.0, "top_k": 40.0}  # the UI's number boxes give floats
    list(ui.stylize(str(tmp_path / "c.png"), str(tmp_path / "s.png"), **controls))
    assert client.options == [python]
    # the video tab: its controls that are request fields (the rest stay at their defaults), a clip's fields only
    tab = [k for k in inspect.signature(VideoTab.stylize).parameters if k in StylizeRequest.model_fields]
    assert tab and not set(tab) & set(IMAGE_ONLY)
    (tmp_path / "clip.mp4").write_bytes(b"")
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))  # where the tab writes the returned clip
    VideoTab(client).stylize(str(tmp_path / "clip.mp4"), str(tmp_path / "s.png"), **{k: controls[k] for k in tab})
    defaults = {k: f.default for k, f in StylizeRequest.model_fields.items() if k not in tab}
    assert client.options[1:] == [video.model_copy(update=defaults)]


def test_the_service_the_python_call_and_the_cli_give_the_same_image(http, recorded, tmp_path, micro_model_dir):
    files = {"content": ("c.png", png(CONTENT), "image/png"), "style": ("s.png", png(STYLE), "image/png")}
    r = http.post("/stylize", files=files, data=form_fields(StylizeRequest.of(**VALUES)),
                  headers={"Accept": "application/json"})
    assert r.status_code == 200, r.text
    assert recorded["requests"] == [StylizeRequest.of(**VALUES)] and len(recorded["configs"]) == 1
    import base64

    served = [pixels(base64.b64decode(im["data"])) for im in r.json()["images"]]
    pipe = http.app.state.service.runner.pipe  # the service's own pipeline (prepared as the service runs it)
    recorded["configs"].clear()
    ours = pipe(CONTENT, StyleMix.of(STYLE), max_side=256, **VALUES)
    assert len(recorded["configs"]) == 1  # resolved once: no second merge of config.json, no rebuild in generate
    assert [np.asarray(im).tolist() for im in ours] == [s.tolist() for s in served]
    CONTENT.save(tmp_path / "c.png")
    STYLE.save(tmp_path / "s.png")
    out = tmp_path / "o.png"
    assert cli.main(["stylize", str(tmp_path / "c.png"), str(tmp_path / "s.png"), "-o", str(out), *FLAGS,
                     "--model", str(micro_model_dir), "--max-size", "256"]) == 0
    written = [pixels((tmp_path / f"o-seed-{s}.png").read_bytes()) for s in (11, 12)]
    assert [w.tolist() for w in written] == [s.tolist() for s in served]


@pytest.mark.parametrize("name, value", [("top_p", 5), ("top_k", -3), ("guidance", 11)])
def test_the_python_call_refuses_what_the_form_refuses_with_the_same_message(http, name, value):
    files = {"content": ("c.png", png(CONTENT), "image/png"), "style": ("s.png", png(STYLE), "image/png")}
    r = http.post("/stylize", files=files, data={name: str(value)})
    assert r.status_code == 422 and r.json()["error"] == "validation_error"
    with pytest.raises(ValueError) as refused:
        http.app.state.service.runner.pipe(CONTENT, STYLE, **{name: value})
    assert str(refused.value) == r.json()["detail"]
