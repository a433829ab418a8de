"""The web UI against the real service: `python -m serve` (UI mounted at /ui) in a subprocess on a free
loopback port with a tiny random model marked as the demo model; the UI's client, handlers, Gradio
endpoint (through gradio_client), the standalone `python -m web --api URL`, and error messages.
"""
from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys

import gradio as gr
import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from gradio_client import Client, handle_file
from PIL import Image

from serve.settings import ServeSettings
from serve.testing import ServerProcess, free_port
from stylevar.baselines.magenta import magenta_available
from stylevar.pipelines.pipeline import StylePipeline
from tests.conftest import use_weight_cache
from web.baseline import AdaINBaseline
from stylevar.pipelines.request import StylizeRequest
from web.client import Preview, Result, ServiceClient, ServiceError, form_fields
from web.mount import loopback_url
from web.ui import (DEMO_LABEL, MAX_SCALES, PAINTED_PAIRS, StyleVARUI, UIConfig, example_pairs, examples_dir,
                    model_markdown)

pytestmark = pytest.mark.slow  # the fast lane (-m "not slow") leaves this file out

MAX_UPLOAD = 200_000
KEY = "ui-test-key"
CONTENT_SIZE = (96, 64)  # 3:2 landscape


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch):
    """gradio_client.Client reports its use unless told not to (tests never reach out)."""
    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "False")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")


def gradient(w: int, h: int) -> Image.Image:
    x = np.linspace(0, 255, w, dtype=np.float32)[None, :].repeat(h, 0)
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None].repeat(w, 1)
    return Image.fromarray(np.stack([x, y, 255 - x], -1).astype(np.uint8), "RGB")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    pipe = StylePipeline.random("tiny", name="ui-test-model")
    pipe.config.demo = True
    return pipe.save_pretrained(tmp_path_factory.mktemp("ui-model"))


@pytest.fixture(scope="module")
def patch_nums(model_dir) -> list[int]:
    return json.loads((model_dir / "config.json").read_text())["transformer"]["patch_nums"]


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    settings = {"STYLEVAR_MAX_UPLOAD_BYTES": str(MAX_UPLOAD), "STYLEVAR_MAX_WAIT_MS": "5",
                "STYLEVAR_API_KEYS": f"other-key,{KEY}"}
    srv = ServerProcess.serve(model_dir, settings=settings, extra_args=(), log_dir=tmp_path_factory.mktemp("logs"))
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("images")
    gradient(*CONTENT_SIZE).save(d / "content.png")
    Image.open(examples_dir() / "style_dots.png").save(d / "style.png")  # a drawn style, small enough to upload
    (d / "notes.txt").write_text("this is not an image\n")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)).save(d / "big.png")  # > MAX_UPLOAD
    assert (d / "big.png").stat().st_size > MAX_UPLOAD
    return d


@pytest.fixture
def client(server):
    with ServiceClient(server.url, api_key=KEY, timeout_s=60) as c:
        yield c


def no_adain(tmp_path, monkeypatch) -> AdaINBaseline:
    use_weight_cache(monkeypatch, tmp_path)
    return AdaINBaseline()


# ---- the client -----------------------------------------------------------------------------------
def test_model_info(client, patch_nums):
    info = client.model_info()
    assert info["demo"] is True and info["name"] == "ui-test-model"
    assert info["patch_nums"] == patch_nums


def test_stream_gives_one_preview_per_scale_then_the_result(client, images, patch_nums):
    events = list(client.stylize_stream(images / "content.png", images / "style.png",
                                        StylizeRequest(seed=7, num_samples=2)))
    previews, result = events[:-1], events[-1]
    assert all(isinstance(e, Preview) for e in previews) and isinstance(result, Result)
    assert [p.scale for p in previews] == list(range(len(patch_nums)))
    assert [p.patch_num for p in previews] == patch_nums
    assert all(len(p.images) == 2 for p in previews)
    assert [r.seed for r in result.images] == [7, 8]
    assert all(r.image.size == CONTENT_SIZE and r.media_type == "image/png" for r in result.images)
    assert Image.open(io.BytesIO(result.images[0].data)).size == CONTENT_SIZE


def test_same_seed_same_image(client, images):
    def run() -> bytes:
        return list(client.stylize_stream(images / "content.png", images / "style.png", StylizeRequest(seed=3)))[-1]

    a, b = run(), run()
    assert np.array_equal(np.asarray(a.images[0].image), np.asarray(b.images[0].image))


def test_service_errors_are_readable(client, images, patch_nums):
    with pytest.raises(ServiceError) as e:
        list(client.stylize_stream(images / "notes.txt", images / "style.png"))
    assert e.value.status == 415 and e.value.message.startswith("Not a supported image")
    assert "JPEG, PNG or WebP" in e.value.message
    with pytest.raises(ServiceError) as e:
        list(client.stylize_stream(images / "big.png", images / "style.png"))
    assert e.value.status == 413 and e.value.message.startswith("Upload too large")
    with pytest.raises(ServiceError) as e:
        list(client.stylize_stream(images / "content.png", images / "style.png",
                                   StylizeRequest(alphas=(0.5,) * (len(patch_nums) + 1))))
    assert e.value.status == 422 and "Invalid input" in e.value.message and "scales" in e.value.message


def test_missing_api_key_is_readable(server):
    with ServiceClient(server.url, timeout_s=10) as c, pytest.raises(ServiceError) as e:
        c.model_info()
    assert e.value.status == 401 and "needs an API key" in e.value.message


def test_closing_the_stream_early(client, images):
    stream = client.stylize_stream(images / "content.png", images / "style.png")
    assert isinstance(next(stream), Preview)
    stream.close()  # closes the connection: the service drops the job
    assert client.model_info()["demo"] is True  # the pool still works


def test_unreachable_service_is_readable():
    with ServiceClient(f"http://127.0.0.1:{free_port()}", timeout_s=5) as c, pytest.raises(ServiceError) as e:
        c.model_info()
    assert e.value.status is None and e.value.message.startswith("Cannot reach the StyleVAR service")


def _mock(handler) -> ServiceClient:
    return ServiceClient("http://service.test", transport=httpx.MockTransport(handler))


def test_messages_show_no_server_paths():
    """A service error naming its folders reaches the UI with the file's name only."""
    e = ServiceError(503, "not_ready", "the model is not loaded (failed: /srv/models/demo/config.json: not a "
                                       "model directory; see /var/log/stylevar/)")
    assert e.message == ("The service is busy (the model is not loaded (failed: config.json: not a model directory; "
                         "see a folder)). Please try again in a moment.")
    assert "/" not in ServiceError(500, "inference_failed", "CUDA error at /opt/torch/lib/x.so:12").message
    kept = ServiceError(422, "validation_error", "top_p: must be in 0..1 (e.g. 0.9/1.0), see https://x.org/a/b")
    assert kept.message == "Invalid input: top_p: must be in 0..1 (e.g. 0.9/1.0), see https://x.org/a/b."


def test_busy_and_deadline_messages(images):
    def busy(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, headers={"Retry-After": "2"},
                              json={"error": "queue_full", "detail": "the queue is full"})

    with pytest.raises(ServiceError) as e:
        list(_mock(busy).stylize_stream(images / "content.png", images / "style.png"))
    assert e.value.message == "The service is busy (the queue is full). Please try again in 2 s."

    def slow(request: httpx.Request) -> httpx.Response:
        return httpx.Response(504, json={"error": "deadline_exceeded", "detail": "too slow"})

    with pytest.raises(ServiceError) as e:
        list(_mock(slow).stylize_stream(images / "content.png", images / "style.png"))
    assert e.value.status == 504 and "took too long" in e.value.message

    def late(request: httpx.Request) -> httpx.Response:  # the deadline passes mid-stream
        body = 'event: error\ndata: {"error":"deadline_exceeded","detail":"the request took too long"}\n\n'
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, content=body.encode())

    with pytest.raises(ServiceError) as e:
        list(_mock(late).stylize_stream(images / "content.png", images / "style.png"))
    assert e.value.status == 504 and "took too long" in e.value.message

    def not_json(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, text="slow down")

    with pytest.raises(ServiceError) as e:
        _mock(not_json).model_info()
    assert e.value.status == 429 and e.value.message.startswith("The service is busy")


def test_options_become_form_fields():
    form = form_fields(StylizeRequest(style_strength=-0.5, seed=3, alphas=(0.1, 0.9), preserve_color=True))
    assert form["style_strength"] == "-0.5" and form["seed"] == "3" and form["alphas"] == "0.1,0.9"
    assert form["preserve_color"] == "true"
    assert form_fields(StylizeRequest()) == {}  # the service's defaults are the same declaration's: nothing to send
    assert form_fields(StylizeRequest(format="jpeg", guidance=0.5)) == {"format": "jpeg", "guidance": "0.5"}


# ---- the UI's handlers ----------------------------------------------------------------------------
@pytest.fixture
def ui(server, tmp_path, monkeypatch):
    return StyleVARUI(UIConfig(api_url=server.url, api_key=KEY), baselines=(no_adain(tmp_path, monkeypatch),))


def stylize_args(images, *, custom=False, alphas=(), **over):
    """The handler's inputs by name, as the page sends them."""
    args = dict(content=str(images / "content.png"), style=str(images / "style.png"), style_strength=0.2, seed=11,
                top_k=900, top_p=0.96, num_samples=1, preserve_color=False, resize="stretch", adain=False,
                adain_alpha=1.0, style2=None, style1_weight=0.5, mask=None, guidance=0.0, upsample="guided",
                custom_alphas=custom)
    args.update(over)
    args.update({f"alpha_{k + 1}": a for k, a in enumerate(alphas)})
    return args


def test_handler_streams_previews_then_results(ui, images, patch_nums):
    outs = list(ui.stylize(**stylize_args(images, custom=True, alphas=[0.5] * MAX_SCALES)))
    assert outs[0][2].startswith("Sending")
    previews = [o for o in outs if isinstance(o[0], Image.Image) and isinstance(o[2], str)
                and o[2].startswith("Generating")]
    assert len(previews) == len(patch_nums)
    assert f"scale {len(patch_nums)} of {len(patch_nums)}" in previews[-1][2]
    final_preview, gallery, status, _ = outs[-1]
    assert status.startswith("Done") and "seed 11" in status
    assert len(gallery) == 1 and gallery[0][0].size == CONTENT_SIZE and gallery[0][1] == "seed 11"
    assert final_preview.size == CONTENT_SIZE
    assert "Note" not in status


def test_a_tiny_picture_is_said_in_the_status_as_the_command_line_says_it(ui, images, tmp_path):
    Image.new("RGB", (1, 1), (200, 10, 10)).save(tmp_path / "one.png")
    *_, (_, gallery, status, _) = ui.stylize(**stylize_args(images, content=str(tmp_path / "one.png")))
    assert len(gallery) == 1 and status.startswith("Done") and status.endswith(
        " **Note:** the content image is only 1x1 pixels; it is scaled up to the model's size and carries little "
        "content (use an image of at least 16x16).")


def test_handler_errors_are_readable(ui, images):
    with pytest.raises(gr.Error, match="Add a content image and a style image"):
        list(ui.stylize(**stylize_args(images, content=None)))
    outs = []
    with pytest.raises(gr.Error) as e:
        for out in ui.stylize(**stylize_args(images, content=str(images / "notes.txt"))):
            outs.append(out)
    assert e.value.message.startswith("Not a supported image")
    assert outs[-1][2].startswith("**Error:** Not a supported image")


def test_on_load_fills_the_model_panel_and_alpha_sliders(ui, patch_nums):
    panel, top_k, top_p, *sliders, run_baseline = ui.on_load()
    assert run_baseline["value"] is False  # no baseline can run here: the page leaves its box unticked
    assert DEMO_LABEL in panel and f"{len(patch_nums)} scales" in panel
    assert (top_k["value"], top_p["value"]) == (900, 0.96)  # the test model recommends no sampling settings
    assert len(sliders) == MAX_SCALES
    visible = [s for s in sliders if s["visible"]]
    assert len(visible) == len(patch_nums)
    assert visible[-1]["label"] == f"α, scale {len(patch_nums)} ({patch_nums[-1]}×{patch_nums[-1]})"


def test_model_panel_of_an_unreachable_service(tmp_path, monkeypatch):
    ui = StyleVARUI(UIConfig(api_url=f"http://127.0.0.1:{free_port()}", timeout_s=5),
                    baselines=(no_adain(tmp_path, monkeypatch),))
    panel, _, _, *sliders, _ = ui.on_load()
    assert "Cannot reach the StyleVAR service" in panel and not any(s["visible"] for s in sliders)


def test_model_markdown_names_a_trained_model():
    text = model_markdown({"name": "stylevar-d20", "demo": False, "image_size": 256, "patch_nums": [1, 2],
                           "devices": ["cuda:0"], "dtype": "bfloat16", "version": "0.1.0"})
    assert "stylevar-d20" in text and DEMO_LABEL not in text and "cuda:0" in text
    assert "Precision" not in text  # a service that does not say


def test_model_markdown_says_the_precision_and_why():
    text = model_markdown({"name": "stylevar-demo", "demo": True, "image_size": 64, "patch_nums": [1, 2],
                           "devices": ["cpu"], "dtype": "float32", "precision": "fp32",
                           "precision_reason": "no native bfloat16 on this CPU"})
    assert "Precision fp32: no native bfloat16 on this CPU" in text


def test_adain_panel_says_why_it_is_off(tmp_path, monkeypatch):
    status = no_adain(tmp_path, monkeypatch).status()
    assert not status.available
    assert "not installed" in status.reason or (
        "vgg_normalised.pth" in status.reason and "stylevar weights fetch adain_vgg adain_decoder" in status.reason)


def write_adain_standins(home) -> None:
    """Random tensors in the layouts of `vgg_normalised.pth` and `decoder.pth`, where the registry looks."""
    from stylevar.baselines.adain import decoder_layers, vgg_normalised_layers

    home.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    for layers, name in ((vgg_normalised_layers(), "vgg_normalised.pth"), (decoder_layers(), "decoder.pth")):
        torch.save({k: torch.randn_like(v) * 0.05 for k, v in layers.state_dict().items()}, home / name)


def test_adain_beside_stylevar_with_standin_weights(server, images, tmp_path, monkeypatch):
    pytest.importorskip("stylevar.baselines.adain")
    baseline = no_adain(tmp_path, monkeypatch)
    write_adain_standins(tmp_path / "sv")
    status = baseline.status()
    assert status.available and "decoder.pth" in status.reason
    ui = StyleVARUI(UIConfig(api_url=server.url, api_key=KEY), baselines=(baseline,))
    outs = list(ui.stylize(**stylize_args(images, adain=True, adain_alpha=0.8)))
    assert "Running AdaIN" in outs[-2][2]
    adain_img = outs[-1][3]
    assert isinstance(adain_img, Image.Image) and adain_img.size == CONTENT_SIZE
    assert outs[-1][2].startswith("Done")


def test_examples_are_photographs_with_paintings_first_then_the_drawn_pairs():
    pairs = example_pairs()
    painted, drawn = pairs[:len(PAINTED_PAIRS)], pairs[len(PAINTED_PAIRS):]
    assert len(painted) >= 4 and len(drawn) >= 3
    for content, style in painted:
        assert os.path.basename(content).startswith("photo_") and os.path.basename(style).startswith("painting_")
    for content, style in drawn:
        assert os.path.basename(content).startswith("content_") and os.path.basename(style).startswith("style_")
    for path in {p for pair in pairs for p in pair}:
        with Image.open(path) as im:
            im.load()
            assert im.mode == "RGB" and 0 < max(im.size) <= 512, (path, im.mode, im.size)
        assert os.path.getsize(path) < 250_000, path


def test_every_shipped_photograph_and_painting_has_its_source_and_licence_recorded():
    folder = examples_dir()
    rows = {line.split("|")[1].strip(): line for line in (folder / "README.md").read_text().splitlines()
            if line.startswith("| ") and line.count("|") >= 6}
    shipped = sorted(p.name for p in folder.iterdir() if p.name.startswith(("photo_", "painting_")))
    assert shipped == sorted(name for pair in PAINTED_PAIRS for name in pair)  # every one is offered, none unused
    for name in shipped:
        assert name in rows, f"{name} is not in {folder / 'README.md'}"
        assert any(word in rows[name] for word in ("public domain", "CC0", "CC-BY", "GPL")), rows[name]


# ---- Gradio endpoint, mounting, standalone --------------------------------------------------------
def test_gradio_client_gets_an_image(server, images):
    client = Client(server.url + "/ui/", auth=("anyone", KEY), verbose=False)  # the key is the password
    preview, gallery, status, baseline = client.predict(
        handle_file(str(images / "content.png")), handle_file(str(images / "style.png")),
        style_strength=0.0, seed=5, adain=True, api_name="/stylize")
    assert status.startswith("Done") and "seed 5" in status
    assert Image.open(gallery[0]["image"]).size == CONTENT_SIZE
    assert Image.open(preview).size == CONTENT_SIZE
    if magenta_available():  # the panel's default on a machine with the teacher extra: Magenta, when asked for
        assert Image.open(baseline).size == CONTENT_SIZE


def test_gradio_client_reads_named_outputs_without_update_objects_and_no_baseline_by_default(server, images):
    client = Client(server.url + "/ui/", auth=("anyone", KEY), verbose=False)
    api = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    stylize = [r["label"] for r in api["/stylize"]["returns"]]
    assert stylize[:3] == ["Coarse-to-fine preview", "Results", "Status"] and stylize[3].endswith("(baseline)")
    assert [r["label"] for r in api["/stylize_video"]["returns"]] == ["Stylized clip", "Status"]
    defaults = {p["parameter_name"]: p["parameter_default"] for p in api["/stylize"]["parameters"]}
    assert defaults["adain"] is False  # the baseline runs for an API caller only when asked for
    job = client.submit(handle_file(str(images / "content.png")), handle_file(str(images / "style.png")), seed=2,
                        api_name="/stylize")
    preview, gallery, status, baseline = job.result(timeout=120)
    assert status.startswith("Done") and "Running" not in status and baseline is None
    assert Image.open(preview).size == Image.open(gallery[0]["image"]).size == CONTENT_SIZE
    messages = job.outputs()  # every message of the stream, the previews' among them
    assert len(messages) > 2 and all(len(m) == 4 for m in messages)
    assert "__type__" not in json.dumps(messages)  # no Gradio update object in any output


def test_loopback_url():
    assert loopback_url("0.0.0.0", 8000) == "http://127.0.0.1:8000"
    assert loopback_url("::", 8000) == "http://[::1]:8000"
    assert loopback_url("10.1.2.3", 80) == "http://10.1.2.3:80"
    assert loopback_url("localhost", 8000) == "http://localhost:8000"
    with pytest.raises(ValueError, match="fixed --port"):
        loopback_url("127.0.0.1", 0)


def test_mounted_ui_asks_for_an_api_key(model_dir):
    from serve.http.app import create_app

    app = create_app(ServeSettings(model_dir=model_dir, port=free_port(), api_keys=["k-1", "k-2"]))
    http = TestClient(app)  # no lifespan: the model is not loaded, the UI routes answer anyway
    assert http.get("/ui/config").status_code == 401
    assert http.post("/ui/login", data={"username": "anyone", "password": "wrong"}).status_code == 400
    assert http.post("/ui/login", data={"username": "anyone", "password": "k-2"}).status_code == 200
    assert http.get("/ui/config").status_code == 200


def test_no_ui_leaves_it_out(model_dir):
    from serve.http.app import create_app

    app = create_app(ServeSettings(model_dir=model_dir, port=free_port(), ui=False))
    assert TestClient(app).get("/ui/").status_code == 404


@pytest.mark.slow
def test_standalone_ui_against_a_remote_service(server, images, tmp_path):
    with ServerProcess.web(server.url, env={"STYLEVAR_API_KEY": KEY}, log_dir=tmp_path) as web:
        url = web.wait_ready(timeout=60, path="/healthz").url
        assert "StyleVAR" in httpx.get(url + "/", timeout=10).text
        _, gallery, status, _ = Client(url + "/", verbose=False).predict(
            handle_file(str(images / "content.png")), handle_file(str(images / "style.png")), api_name="/stylize")
        assert status.startswith("Done") and Image.open(gallery[0]["image"]).size == CONTENT_SIZE


@pytest.mark.slow
def test_the_ui_does_not_import_the_service():
    code = ("import sys, web, web.__main__, web.mount; "
            "print(sorted(m for m in sys.modules if m == 'serve' or m.startswith('serve.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_web_cli_without_an_api_or_on_a_taken_port_is_one_line():
    out = subprocess.run([sys.executable, "-m", "web"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1] == (
        "python -m web: error: --api URL is required: the address of a running `python -m serve`, e.g. "
        "http://127.0.0.1:8000 (that service also serves this UI itself, at /ui)")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "web", "--api", "http://127.0.0.1:9", "--port", str(port)],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith(
        f"python -m web: error: cannot start: 127.0.0.1:{port} is already in use")


@pytest.mark.slow
def test_web_cli_says_where_it_is_and_when_the_service_does_not_answer(tmp_path):
    api = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with ServerProcess.web(api, log_dir=tmp_path) as web:
        web.wait_ready(timeout=90, path="/healthz")
        log = web.log_text_once(lambda text: "StyleVAR UI ready" in text)
    assert f"note: Cannot reach the StyleVAR service: {api}: " in log and "start it with `python -m serve`" in log
    assert f"StyleVAR UI ready: {web.url}/  (service: {api})" in log


@pytest.mark.slow
def test_web_cli_rejects_a_bad_url():
    out = subprocess.run([sys.executable, "-m", "web", "--api", "gpu-box:8000"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "--api must be an http(s) URL" in out.stderr
