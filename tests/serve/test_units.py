"""Settings, form parsing, image helpers, logging, metrics isolation, UI mounting and start-up errors."""
from __future__ import annotations

import io
import json
import logging
import subprocess
import sys

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from PIL import Image
from pydantic import ValidationError

from serve.http import imaging
from serve.http.logs import JsonFormatter, new_request_id, request_id_var
from serve.http.metrics import ServiceMetrics
from serve.http.schemas import StylizeForm
from stylevar.pipelines.request import RequestError, StylizeRequest
from serve.settings import ServeSettings
from stylevar.processing.images import CorruptImageError, ImageTooLargeError, NotAnImageError
from stylevar.loaders.model_dir import DEMO_MODEL_DIR, ModelDirError
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.processing.postprocess import preserve_color


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-model")
    StylePipeline.random("tiny").save_pretrained(d)
    return d


# ---- settings -------------------------------------------------------------------------------------
def test_settings_come_from_stylevar_env(monkeypatch, tmp_path):
    monkeypatch.setenv("STYLEVAR_API_KEYS", "a, b ,c")
    monkeypatch.setenv("STYLEVAR_CORS_ORIGINS", "https://x.example")
    monkeypatch.setenv("STYLEVAR_MAX_BATCH_SIZE", "4")
    monkeypatch.setenv("STYLEVAR_DEVICE", "cuda:0,cuda:1")
    monkeypatch.setenv("STYLEVAR_MODEL_DIR", str(tmp_path))
    monkeypatch.setenv("STYLEVAR_WARMUP", "false")
    s = ServeSettings()
    assert s.api_keys == ["a", "b", "c"] and s.cors_origins == ["https://x.example"]
    assert s.max_batch_size == 4 and s.device == ["cuda:0", "cuda:1"] and s.model_dir == tmp_path
    assert s.warmup is False
    assert "api_keys" not in repr(s), "keys stay out of repr"
    assert ServeSettings(max_batch_size=2).max_batch_size == 2  # explicit values win over the environment


def test_settings_defaults_and_validation(monkeypatch):
    for var in ("STYLEVAR_API_KEYS", "STYLEVAR_MODEL_DIR", "STYLEVAR_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    s = ServeSettings()
    assert s.api_keys == [] and s.device == ["auto"] and s.model_dir.resolve() == DEMO_MODEL_DIR.resolve()
    monkeypatch.setenv("STYLEVAR_MAX_BATCH_SIZE", "0")
    with pytest.raises(ValidationError):
        ServeSettings()
    monkeypatch.setenv("STYLEVAR_MAX_BATCH_SIZE", "8")
    monkeypatch.setenv("STYLEVAR_DEVICE", " , ")
    with pytest.raises(ValidationError):
        ServeSettings()
    monkeypatch.delenv("STYLEVAR_DEVICE")
    monkeypatch.setenv("STYLEVAR_PRECISION", "int8")  # removed: refused at start-up saying why
    with pytest.raises(ValidationError, match=r"int8 was removed: .*torchao.*use bf16.*fp32, bf16"):
        ServeSettings()


# ---- form -----------------------------------------------------------------------------------------
def test_alphas_accept_commas_or_json_and_reject_the_rest():
    assert StylizeRequest.of(alphas="0.1, 0.2,0.3").alphas == (0.1, 0.2, 0.3)
    assert StylizeRequest.of(alphas="[0, 1]").alphas == (0.0, 1.0)
    for bad in ("a,b", "[]x", '{"a": 1}', "0.1,,0.2", "nan,0.1", "1.5", "[-0.1]", "[" * 1000):
        with pytest.raises(RequestError, match="alphas"):
            StylizeRequest.of(alphas=bad)
    assert StylizeForm(alphas=" ").request().alphas is None
    with pytest.raises(RequestValidationError):
        StylizeForm(alphas="x").request()
    with pytest.raises(ValidationError):
        StylizeForm(top_p=float("nan"))


# ---- images ---------------------------------------------------------------------------------------
def png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def test_decode_upload_checks_pixels_before_decoding_and_rejects_other_formats():
    webp = io.BytesIO()
    Image.new("RGB", (20, 20)).save(webp, "WEBP")
    with pytest.raises(ImageTooLargeError, match="only JPEG and 8-bit PNG images are shrunk"):
        imaging.decode_upload(webp.getvalue(), max_pixels=399)  # decoded whole only: it cannot be shrunk
    shrunk = imaging.decode_upload(png(Image.new("RGB", (20, 20))), max_pixels=399)
    assert (shrunk.image.size, shrunk.size, shrunk.shrink) == ((10, 10), (20, 20), 2)
    assert imaging.shrink_headers(shrunk) == {
        "X-Content-Shrunk": "the content image is 20x20 = 400 pixels, more than the limit of 399: it was shrunk 2x "
                            "while decoding, to 10x10"}
    whole = imaging.decode_upload(png(Image.new("RGB", (20, 20))), max_pixels=400)
    assert (whole.image.size, whole.shrink, imaging.shrink_headers(whole)) == ((20, 20), 1, {})
    gif = io.BytesIO()
    Image.new("RGB", (8, 8)).save(gif, "GIF")
    with pytest.raises(NotAnImageError) as e:
        imaging.decode_upload(gif.getvalue(), max_pixels=1000)
    assert e.value.code == "not_an_image"
    with pytest.raises(CorruptImageError):
        imaging.decode_upload(png(Image.new("RGB", (64, 64), (1, 2, 3)))[:60], max_pixels=10_000)


def test_preserve_color_takes_luminance_from_the_result_and_chroma_from_the_content():
    rng = np.random.default_rng(0)
    result = Image.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8), "RGB")
    content = Image.new("RGB", (80, 60), (60, 140, 200))
    out = preserve_color(result, content)
    assert out.size == result.size and out.mode == "RGB"
    y_out = np.asarray(out.convert("YCbCr"), np.float32)
    y_res = np.asarray(result.convert("YCbCr"), np.float32)
    c_con = np.asarray(content.convert("YCbCr"), np.float32)[0, 0]
    inside = (y_res[..., 0] > 60) & (y_res[..., 0] < 190)  # away from RGB clipping
    assert np.abs(y_out[..., 0] - y_res[..., 0])[inside].mean() < 3
    assert np.abs(y_out[..., 1:] - c_con[1:])[inside].mean() < 4


def test_encode_image_formats():
    img = Image.new("RGB", (12, 10), (5, 6, 7))
    for fmt in ("png", "jpeg", "webp"):
        assert Image.open(io.BytesIO(imaging.encode_image(img, fmt))).format == fmt.upper()
    with pytest.raises(ValueError):
        imaging.encode_image(img, "gif")


# ---- logging and metrics --------------------------------------------------------------------------
def test_json_log_lines_carry_the_request_id():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello %s", ("you",), None)
    record.status = 200
    token = request_id_var.set("rid-1")
    try:
        line = json.loads(JsonFormatter().format(record))
    finally:
        request_id_var.reset(token)
    assert line["msg"] == "hello you" and line["request_id"] == "rid-1" and line["status"] == 200
    assert json.loads(JsonFormatter().format(record))["request_id"] is None
    assert new_request_id("ok-id_1.2") == "ok-id_1.2"
    assert new_request_id("no spaces") != "no spaces" and len(new_request_id(None)) == 32


def test_each_app_has_its_own_metrics_registry():
    a, b = ServiceMetrics(), ServiceMetrics()
    a.observe_request("/stylize", "POST", 200, 0.1)
    assert a.registry.get_sample_value("stylevar_http_requests_total",
                                       {"route": "/stylize", "method": "POST", "status": "200"}) == 1
    assert b.registry.get_sample_value("stylevar_http_requests_total",
                                       {"route": "/stylize", "method": "POST", "status": "200"}) is None


def test_made_up_methods_share_one_label_and_the_scrape_runs_off_the_event_loop(model_dir, monkeypatch):
    """Issue 55, finding 3 in small: 300 requests with made-up methods leave one `other` label, not 300; the scrape
    renders on a worker thread (no running event loop there)."""
    import asyncio

    from fastapi.testclient import TestClient

    from serve.http.app import create_app

    with TestClient(create_app(ServeSettings(model_dir=model_dir, device=["cpu"], ui=False, warmup=False))) as c:
        before = len(c.get("/metrics").content)
        for i in range(300):
            c.request(f"M{i:07X}", "/healthz")
        c.request("M0000001", "/no/such/path/4242")
        metrics = c.app.state.service.metrics
        rendered_on_loop = []
        real = metrics.render

        def render() -> bytes:
            try:
                asyncio.get_running_loop()
                rendered_on_loop.append(True)
            except RuntimeError:
                rendered_on_loop.append(False)
            return real()

        monkeypatch.setattr(metrics, "render", render)
        text = c.get("/metrics").text
    assert "M000" not in text and "4242" not in text
    assert metrics.registry.get_sample_value("stylevar_http_requests_total",
                                             {"route": "/healthz", "method": "other", "status": "405"}) == 300
    assert len(text) < before + 12_000, "a few new series (a histogram each), not one per method"
    assert rendered_on_loop == [False]


# ---- app construction -----------------------------------------------------------------------------
def test_ui_mounting_is_optional(model_dir, caplog):
    from serve.http.app import create_app, mount_optional_ui

    calls = []

    def mounter(app: FastAPI, settings: ServeSettings) -> None:
        calls.append(settings)

    create_app(ServeSettings(model_dir=model_dir, device=["cpu"], ui=True), ui_mounter=mounter)
    create_app(ServeSettings(model_dir=model_dir, device=["cpu"], ui=False), ui_mounter=mounter)
    assert len(calls) == 1

    def without_gradio(app: FastAPI, settings: ServeSettings) -> None:
        raise ModuleNotFoundError("No module named 'gradio'", name="gradio")

    def broken(app: FastAPI, settings: ServeSettings) -> None:
        raise ModuleNotFoundError("No module named 'typo_module'", name="typo_module")

    app = FastAPI()
    with caplog.at_level(logging.WARNING, logger="serve.http.app"):
        assert mount_optional_ui(without_gradio, app, ServeSettings(model_dir=model_dir)) is False
    assert "UI not mounted" in caplog.text
    with pytest.raises(ModuleNotFoundError):  # other import errors are bugs, not a missing extra
        mount_optional_ui(broken, app, ServeSettings(model_dir=model_dir))


def test_the_web_ui_is_mounted_at_ui(model_dir):
    from serve.http.app import create_app

    app = create_app(ServeSettings(model_dir=model_dir, device=["cpu"], ui=True, port=8123))
    assert any(getattr(r, "path", None) == "/ui" for r in app.routes)


def test_two_apps_live_in_one_process(model_dir):
    from fastapi.testclient import TestClient

    from serve.http.app import create_app

    apps = [create_app(ServeSettings(model_dir=model_dir, device=["cpu"], ui=False, warmup=False)) for _ in range(2)]
    with TestClient(apps[0]) as c0, TestClient(apps[1]) as c1:
        c0.get("/healthz")
        c0.get("/healthz")
        c1.get("/healthz")
        m0, m1 = c0.get("/metrics").text, c1.get("/metrics").text
    assert 'stylevar_http_requests_total{method="GET",route="/healthz",status="200"} 2.0' in m0
    assert 'stylevar_http_requests_total{method="GET",route="/healthz",status="200"} 1.0' in m1


def test_routes_read_the_app_state_through_dependencies_a_test_can_override(model_dir):
    from dataclasses import replace

    from fastapi.testclient import TestClient

    from serve.http.app import create_app
    from serve.http.state import get_state, require_key

    app = create_app(ServeSettings(model_dir=model_dir, device=["cpu"], ui=False, api_keys=["k-1"]))
    http = TestClient(app)  # no lifespan: the model is not loaded
    assert http.get("/readyz").status_code == 503 and http.get("/v1/model").status_code == 401
    app.dependency_overrides[get_state] = lambda: replace(app.state.service, ready=True)
    app.dependency_overrides[require_key] = lambda: None
    assert http.get("/readyz").json() == {"status": "ready"}
    r = http.get("/v1/model")
    assert r.status_code == 503 and r.json()["error"] == "not_ready"


@pytest.mark.slow
def test_missing_model_fails_at_start_naming_the_path(tmp_path):
    from serve.http.app import create_app

    with pytest.raises(ModelDirError) as e:
        create_app(ServeSettings(model_dir=tmp_path, device=["cpu"]))
    assert str(tmp_path) in str(e.value) and "config.json" in str(e.value)  # python -m serve: tests/serve/test_guidance


def test_missing_demo_model_says_how_to_make_it():
    from stylevar.loaders.model_dir import check_model_dir

    if (DEMO_MODEL_DIR / "config.json").is_file():
        check_model_dir(DEMO_MODEL_DIR)  # shipped: it must be complete
        return
    with pytest.raises(ModelDirError) as e:
        check_model_dir(DEMO_MODEL_DIR)
    assert "scripts/train_demo_model.sh" in str(e.value) and str(DEMO_MODEL_DIR) in str(e.value)


def test_png_answers_keep_their_pixels_at_every_compression_level():
    yy, xx = np.mgrid[0:40, 0:50]
    img = Image.fromarray(np.stack([xx * 5, yy * 6, (xx + yy) % 7], -1).astype(np.uint8))
    sizes = []
    for level in (0, 1, 6, 9):
        data = imaging.encode_image(img, "png", level)
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(data))), np.asarray(img))
        sizes.append(len(data))
    assert sizes[0] > sizes[-1]  # level 0 stores, 9 compresses
    assert ServeSettings().png_compress_level == 1
    with pytest.raises(ValueError):
        ServeSettings(png_compress_level=10)


def test_the_address_sends_a_browser_to_the_ui_or_answers_the_api_index(model_dir):
    """`GET /` (what a browser opens first): 307 to /ui when the UI is mounted; with --no-ui the API's index."""
    from fastapi.testclient import TestClient

    from serve.http.app import create_app

    def mounter(app: FastAPI, settings: ServeSettings) -> None:
        app.mount("/ui", FastAPI())

    with_ui = TestClient(create_app(ServeSettings(model_dir=model_dir, device=["cpu"], ui=True), ui_mounter=mounter))
    r = with_ui.get("/", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/ui"
    no_ui = TestClient(create_app(ServeSettings(model_dir=model_dir, device=["cpu"], ui=False), ui_mounter=mounter))
    r = no_ui.get("/")
    assert r.status_code == 200 and r.json()["docs"] == "/docs" and r.json()["ui"] is None
    assert "POST /stylize" in r.json()["routes"]
    assert no_ui.get(r.json()["docs"]).status_code == 200  # the link leads somewhere


def test_a_file_given_as_the_model_gets_its_folder_or_the_convert_command(tmp_path):
    from stylevar.loaders.model_dir import check_model_dir
    model = StylePipeline.random("tiny", name="t").save_pretrained(tmp_path / "model")
    (tmp_path / "StyleVAR_SFT.pth").write_bytes(b"not read")
    hints = {model / "transformer.safetensors": f"a file, not a folder. It is one file of a model directory; the "
                                                f"model is {model} (--model {model}).",
             tmp_path / "StyleVAR_SFT.pth": "a file, not a folder. A checkpoint file: `stylevar convert --vae VAE.pth "
                                            "--model STYLEVAR.pth --preset d20 --out DIR`"}
    for given, hint in hints.items():
        with pytest.raises(ModelDirError) as e:
            check_model_dir(given)
        assert hint in str(e.value), str(e.value)


@pytest.mark.slow  # six interpreters
def test_a_wrong_model_gets_the_hint_that_fixes_it_on_the_command_line_and_the_service(tmp_path):
    """One rule (stylevar.loaders.model_dir.check_model_dir) for `stylevar stylize --model` and `python -m serve
    --model`: a training run points to its final/, OWNER/NAME to hf:OWNER/NAME, a missing folder is named missing;
    each is one plain line (the service's JSON info logs beside it)."""
    run = tmp_path / "runs" / "sft"
    StylePipeline.random("tiny", name="t").save_pretrained(run / "final")
    hints = {str(run): f"It is a training run; its model is {run / 'final'} (--model {run / 'final'}).",
             "Senfier-LiqiJing/StyleVAR": "no such folder. A published model on the Hugging Face Hub is written "
                                          "hf:OWNER/NAME: --model hf:Senfier-LiqiJing/StyleVAR",
             str(tmp_path / "nowhere"): f"no usable model at {tmp_path / 'nowhere'}: no such folder."}
    pictures = [str(DEMO_MODEL_DIR.parent / "examples" / n) for n in ("content_shapes.png", "style_dots.png")]
    for model, hint in hints.items():
        with pytest.raises(ModelDirError) as e:
            from stylevar.loaders.model_dir import check_model_dir
            check_model_dir(model)
        assert hint in str(e.value), str(e.value)
        for cmd in ([sys.executable, "-m", "stylevar.cli", "stylize", *pictures, "-o", str(tmp_path / "o.png"),
                     "--model", model], [sys.executable, "-m", "serve", "--model", model, "--port", "0", "--no-ui"]):
            done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
            said = [line for line in done.stderr.splitlines() if not line.startswith('{"ts"')]  # the info logs stay
            assert done.returncode == 2 and len(said) == 1 and hint in said[0], (cmd, done.stderr[-2000:])
