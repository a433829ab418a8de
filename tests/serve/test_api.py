"""The real service over HTTP: a uvicorn subprocess on a free loopback port with a tiny random model."""
from __future__ import annotations

import asyncio
import base64
import io
import json
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from serve.testing import ServerProcess
from stylevar.config import presets

KEY = "test-key-1"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_PIXELS = 1_000_000
MAX_UPLOAD = 2_000_000
VQ_CFG, TR_CFG = presets("tiny")
PATCH_NUMS = list(TR_CFG.patch_nums)
K = len(PATCH_NUMS)
ALPHAS = ",".join(f"{0.1 + 0.8 * k / (K - 1):.2f}" for k in range(K))


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    settings = {
        "STYLEVAR_API_KEYS": f"other-key,{KEY}",
        "STYLEVAR_QUEUE_SIZE": "2",
        "STYLEVAR_MAX_BATCH_SIZE": "8",
        "STYLEVAR_MAX_WAIT_MS": "20",
        "STYLEVAR_MAX_PIXELS": str(MAX_PIXELS),
        "STYLEVAR_MAX_UPLOAD_BYTES": str(MAX_UPLOAD),
        "STYLEVAR_CORS_ORIGINS": "https://app.example",
        "STYLEVAR_LOG_JSON": "true",
    }
    srv = ServerProcess.serve(model_dir, settings=settings, log_dir=tmp_path_factory.mktemp("logs"))
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
        yield c


# ---- images ---------------------------------------------------------------------------------------
def encode(img: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def gradient(w: int, h: int, mode: str = "RGB") -> Image.Image:
    x = np.linspace(0, 255, w, dtype=np.float32)[None, :].repeat(h, 0)
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None].repeat(w, 1)
    rgb = np.stack([x, y, 255 - x], -1).astype(np.uint8)
    return Image.fromarray(rgb, "RGB").convert(mode) if mode != "RGB" else Image.fromarray(rgb, "RGB")


CONTENT = encode(gradient(90, 60), "JPEG", quality=90)  # 3:2 landscape
STYLE = encode(gradient(40, 56))


def files(content: bytes = CONTENT, style: bytes = STYLE, ctype: str = "image/jpeg"):
    return {"content": ("content.jpg", content, ctype), "style": ("style.png", style, "image/png")}


def decode(data: bytes) -> Image.Image:
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


def metric(text: str, name: str, labels: dict[str, str]) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


# ---- the happy path -------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt,media,resize", [("png", "image/png", "stretch"), ("jpeg", "image/jpeg", "pad"),
                                              ("webp", "image/webp", "stretch")])
def test_stylize_returns_an_image_with_the_content_aspect_ratio(client, fmt, media, resize):
    r = client.post("/stylize", files=files(), data={"format": fmt, "resize": resize, "seed": "7"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == media
    assert r.headers["x-seed"] == "7"
    assert float(r.headers["x-inference-ms"]) > 0
    assert r.headers["x-model"] == "tiny-test"
    assert len(r.headers["x-request-id"]) >= 8
    img = decode(r.content)
    assert img.format == fmt.upper()
    assert img.size == (90, 60)


def test_crop_returns_the_centre_square(client):
    r = client.post("/stylize", files=files(), data={"resize": "crop"})
    assert r.status_code == 200, r.text
    assert decode(r.content).size == (60, 60)


def test_same_seed_gives_the_same_image(client):
    a = client.post("/stylize", files=files(), data={"seed": "123"})
    b = client.post("/stylize", files=files(), data={"seed": "123"})
    assert a.status_code == b.status_code == 200
    assert np.array_equal(np.asarray(decode(a.content)), np.asarray(decode(b.content)))


def test_json_response_with_several_samples(client):
    r = client.post("/stylize", files=files(), data={"num_samples": "3", "seed": "40", "top_k": "50", "top_p": "0.9",
                                                    "style_strength": "0.5", "alphas": ALPHAS},
                    headers={"Accept": "application/json"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["seed"] == 40 and body["model"] == "tiny-test" and body["inference_ms"] > 0
    assert [im["seed"] for im in body["images"]] == [40, 41, 42]
    arrays = []
    for im in body["images"]:
        assert im["media_type"] == "image/png" and (im["width"], im["height"]) == (90, 60)
        pic = decode(base64.b64decode(im["data"]))
        assert pic.size == (90, 60)
        arrays.append(np.asarray(pic))
    assert not np.array_equal(arrays[0], arrays[1]), "different seeds give different samples"


def test_one_sample_as_json_when_asked(client):
    r = client.post("/stylize", files=files(), headers={"Accept": "application/json"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert len(r.json()["images"]) == 1


def test_several_samples_cannot_be_one_image(client):
    r = client.post("/stylize", files=files(), data={"num_samples": "2"}, headers={"Accept": "image/png"})
    assert r.status_code == 406 and r.json()["error"] == "not_acceptable"


def test_preserve_color_keeps_the_content_chroma(client):
    content = encode(Image.new("RGB", (64, 48), (200, 40, 40)))
    r = client.post("/stylize", files=files(content, ctype="image/png"), data={"preserve_color": "true"})
    assert r.status_code == 200, r.text
    ycbcr = np.asarray(decode(r.content).convert("YCbCr"), dtype=np.float32)
    want = np.asarray(Image.new("RGB", (1, 1), (200, 40, 40)).convert("YCbCr"), dtype=np.float32)[0, 0]
    # chroma survives up to the clipping of out-of-gamut colours when going back to RGB
    assert abs(ycbcr[..., 1].mean() - want[1]) < 12 and abs(ycbcr[..., 2].mean() - want[2]) < 12


def test_exif_orientation_is_applied(client):
    img = gradient(90, 60)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise when displayed
    content = encode(img, "JPEG", exif=exif.tobytes())
    r = client.post("/stylize", files=files(content))
    assert r.status_code == 200, r.text
    assert decode(r.content).size == (60, 90)


def png_16bit(w: int, h: int) -> bytes:
    arr = (np.arange(w * h, dtype=np.uint16).reshape(h, w) * 37).astype(">u2")
    raw = b"".join(b"\x00" + row.tobytes() for row in arr)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", w, h, 16, 0, 0, 0, 0)  # 16-bit grayscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("kind", ["L", "RGBA", "P", "CMYK", "I;16", "webp"])
def test_image_modes_are_converted(client, kind):
    if kind == "CMYK":
        data, ctype = encode(gradient(50, 40, "CMYK"), "JPEG"), "image/jpeg"
    elif kind == "I;16":
        data, ctype = png_16bit(50, 40), "image/png"
        assert Image.open(io.BytesIO(data)).mode.startswith("I")
    elif kind == "webp":
        data, ctype = encode(gradient(50, 40), "WEBP"), "image/webp"
    else:
        data, ctype = encode(gradient(50, 40, kind)), "image/png"
    r = client.post("/stylize", files=files(data, ctype=ctype))
    assert r.status_code == 200, r.text
    assert decode(r.content).size == (50, 40)


# ---- bad input --------------------------------------------------------------------------------------
def _truncated_png() -> bytes:
    data = encode(gradient(64, 64))
    return data[: len(data) // 2]


BAD_INPUTS = {
    "not an image": (dict(files=files(b"hello, this is text", ctype="text/plain")), 415, "not_an_image"),
    "gif": (dict(files=files(encode(gradient(20, 20), "GIF"), ctype="image/gif")), 415, "not_an_image"),
    "bmp style": (dict(files=files(style=encode(gradient(20, 20), "BMP"))), 415, "not_an_image"),
    "truncated png": (dict(files=files(_truncated_png(), ctype="image/png")), 422, "corrupt_image"),
    "too many pixels": (dict(files=files(encode(Image.new("L", (1200, 1000)), "WEBP"), ctype="image/webp")), 413,
                        "image_too_large"),
    "too many bytes": (dict(files=files(b"\x00" * (MAX_UPLOAD + 10)), ), 413, "payload_too_large"),
    "missing style": (dict(files={"content": ("c.jpg", CONTENT, "image/jpeg")}), 422, "validation_error"),
    "no body": (dict(), 422, "validation_error"),
    "json body": (dict(json={"content": "x"}), 422, "validation_error"),
    "style_strength": (dict(files=files(), data={"style_strength": "2"}), 422, "validation_error"),
    "style_strength nan": (dict(files=files(), data={"style_strength": "nan"}), 422, "validation_error"),
    "num_samples": (dict(files=files(), data={"num_samples": "9"}), 422, "validation_error"),
    "seed": (dict(files=files(), data={"seed": "-1"}), 422, "validation_error"),
    "top_p": (dict(files=files(), data={"top_p": "1.5"}), 422, "validation_error"),
    "resize": (dict(files=files(), data={"resize": "zoom"}), 422, "validation_error"),
    "format": (dict(files=files(), data={"format": "gif"}), 422, "validation_error"),
    "alphas count": (dict(files=files(), data={"alphas": "0.1,0.2"}), 422, "validation_error"),
    "alphas text": (dict(files=files(), data={"alphas": "a,b"}), 422, "validation_error"),
    "alphas range": (dict(files=files(), data={"alphas": "[2" + ",0" * (K - 1) + "]"}), 422, "validation_error"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_input_gets_its_4xx_and_a_json_error(client, case):
    kwargs, status, code = BAD_INPUTS[case]
    r = client.post("/stylize", **kwargs)
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"] == code and isinstance(body["detail"], str) and body["detail"]
    assert set(body) == {"error", "detail"}


def test_common_mistakes_get_hints(client):
    """Text where a file belongs (curl's -F content=photo.jpg, no @) and a misspelled field."""
    r = client.post("/stylize", data={"content": "photo.jpg"}, files={"style": ("s.png", STYLE, "image/png")})
    assert r.status_code == 422
    assert r.json()["detail"] == "content: send a file, not text (curl: -F content=@photo.jpg)"
    r = client.post("/stylize", files={"content": ("c.jpg", CONTENT, "image/jpeg"), "styles": ("s.png", STYLE, "image/png")})
    assert r.status_code == 422
    assert r.json()["detail"] == "unknown field 'styles'; did you mean 'style'?; style: Field required"
    r = client.post("/stylize/stream", files=files(), data={"seeed": "3", "top_k": "x"})
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith("unknown field 'seeed'; did you mean 'seed'?; top_k"), r.text


@pytest.mark.parametrize("route, request_kwargs, detail", [
    ("/stylize", {"json": {"content": "a.jpg", "style": "b.jpg"}}, "send multipart/form-data, not application/json "
     "(curl -F content=@photo.jpg -F style=@art.jpg); content: Field required; style: Field required"),
    ("/stylize/video", {}, "send multipart/form-data, not an empty body (curl -F video=@clip.mp4 -F style=@art.jpg); "
     "video: Field required; style: Field required"),
    ("/stylize", {"files": files(), "data": {"seed": "abc"}},  # int | None: one message, under the field's name
     "seed: Input should be a valid integer, unable to parse string as an integer"),
    ("/stylize", {"files": files(), "data": {"top_p": "x"}}, "top_p: Input should be a valid number, unable to parse "
     "string as a number"),
])
def test_a_body_that_is_not_a_form_and_an_optional_fields_bad_value_read_plainly(client, route, request_kwargs,
                                                                                    detail):
    r = client.post(route, **request_kwargs)
    assert r.status_code == 422 and r.json() == {"error": "validation_error", "detail": detail}


def test_upload_limit_applies_to_the_stream_route_too_and_names_its_setting(client):
    r = client.post("/stylize/stream", files=files(b"\x00" * (MAX_UPLOAD + 10)))
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"
    declared = int(r.request.headers["content-length"])
    assert r.json()["detail"] == (f"request body of {declared} bytes is over the limit of {MAX_UPLOAD} bytes "
                                  "(1.907 MiB), which the service's STYLEVAR_MAX_UPLOAD_BYTES sets")


def test_unknown_route_and_method_answer_json_with_the_way_on(client):
    listed = " (the API's operations are listed at /docs)"
    r = client.get("/nope")
    assert r.status_code == 404 and r.json() == {"error": "not_found", "detail": "unknown path '/nope'" + listed}
    for typo, meant in (("/health", "/healthz"), ("/model", "/v1/model"), ("/stylise", "/stylize")):
        r = client.get(typo)
        assert r.status_code == 404 and r.json()["detail"] == f"unknown path {typo!r}; did you mean {meant!r}?" + listed
    r = client.get("/stylize")
    assert r.status_code == 405 and r.json() == {"error": "method_not_allowed",
                                                 "detail": "GET is not allowed on /stylize; use POST (see /docs)"}


# ---- access control, request ids, CORS ------------------------------------------------------------
def test_api_keys_are_enforced(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"},
                        {"Authorization": "Bearer \u00e9t\u00e9".encode("latin-1")}):
            r = c.post("/stylize", files=files(), headers=headers)
            assert r.status_code == 401, (headers, r.text)
            assert r.json()["error"] == "unauthorized" and r.headers["www-authenticate"] == "Bearer"
        assert c.get("/v1/model").status_code == 401
        assert c.post("/stylize", files=files(), headers={"Authorization": "Bearer other-key"}).status_code == 200
        # probes and metrics stay open
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200
        assert c.get("/metrics").status_code == 200


def test_request_id_is_echoed_or_made_and_logged(client, server):
    r = client.get("/healthz", headers={"X-Request-ID": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    r = client.get("/healthz", headers={"X-Request-ID": "bad id\twith spaces"})
    assert r.headers["x-request-id"] != "bad id\twith spaces" and len(r.headers["x-request-id"]) == 32
    r = client.post("/stylize", files=files(b"nope"), headers={"X-Request-ID": "req-bad-upload"})
    assert r.status_code == 415 and r.headers["x-request-id"] == "req-bad-upload"
    text = server.log_text_once(lambda t: any('"req-bad-upload"' in line and '"msg": "request"' in line
                                              for line in t.splitlines()))
    lines = [json.loads(line) for line in text.splitlines() if line.strip() and not line.startswith("StyleVAR ready")]
    assert all("request_id" in line for line in lines)
    mine = [line for line in lines if line["request_id"] == "req-bad-upload"]
    assert any(line["msg"] == "request" and line["status"] == 415 and line["route"] == "/stylize" for line in mine)


def test_cors_allows_the_configured_origin(client):
    pre = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    r = client.options("/stylize", headers=pre)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
    r = client.options("/stylize", headers={**pre, "Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers
    r = client.get("/healthz", headers={"Origin": "https://app.example"})
    assert "x-request-id" in r.headers["access-control-expose-headers"].lower()


# ---- operations -----------------------------------------------------------------------------------
def test_health_ready_and_model_info(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}
    info = client.get("/v1/model").json()
    assert info["name"] == "tiny-test" and info["demo"] is False
    assert info["devices"] == ["cpu"] and info["dtype"] == "float32"
    assert info["patch_nums"] == PATCH_NUMS and len(info["default_alphas"]) == K
    assert info["image_size"] == VQ_CFG.image_size and info["version"]
    assert info["config"]["format"] == "stylevar"


def test_metrics_count_what_was_sent(client):
    before = client.get("/metrics").text
    for _ in range(2):
        assert client.post("/stylize", files=files()).status_code == 200
    assert client.post("/stylize", files=files(b"text")).status_code == 415
    after = client.get("/metrics").text

    def delta(status: str) -> float:
        labels = {"route": "/stylize", "method": "POST", "status": status}
        return metric(after, "stylevar_http_requests_total", labels) - metric(before, "stylevar_http_requests_total",
                                                                              labels)

    assert delta("200") == 2 and delta("415") == 1
    lat = {"route": "/stylize", "method": "POST"}
    assert (metric(after, "stylevar_http_request_duration_seconds_count", lat)
            - metric(before, "stylevar_http_request_duration_seconds_count", lat)) == 3
    rows = "stylevar_batch_size_rows_count"
    assert metric(after, rows, {}) - metric(before, rows, {}) == 2
    assert metric(after, "stylevar_queue_depth", {}) == 0
    assert metric(after, "stylevar_ready", {}) == 1


def test_stream_yields_one_preview_per_scale_then_the_result(client):
    events = []
    with client.stream("POST", "/stylize/stream", files=files(), data={"seed": "5", "resize": "pad"}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[len("event: "):]
            elif line.startswith("data: "):
                events.append((event, json.loads(line[len("data: "):])))
    names = [e for e, _ in events]
    assert names == ["preview"] * K + ["result"], names
    assert [d["scale"] for _, d in events[:-1]] == list(range(K))
    assert [d["patch_num"] for _, d in events[:-1]] == PATCH_NUMS
    for _, d in events[:-1]:
        pic = decode(base64.b64decode(d["images"][0]))
        assert abs(pic.width / pic.height - 1.5) < 0.05
    result = events[-1][1]
    assert result["seed"] == 5
    assert decode(base64.b64decode(result["images"][0]["data"])).size == (90, 60)


def test_a_full_queue_answers_503_with_retry_after_and_nothing_else_fails(server):
    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=120) as c:
            return await asyncio.gather(*[c.post("/stylize", files=files(), data={"seed": str(i)})
                                          for i in range(20)])

    responses = asyncio.run(burst())
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 503}, statuses
    assert statuses.count(503) >= 1 and statuses.count(200) >= 1, statuses
    for r in responses:
        if r.status_code == 503:
            assert r.json()["error"] == "queue_full" and int(r.headers["retry-after"]) >= 1
        else:
            assert decode(r.content).size == (90, 60)


def test_openapi_is_served(client):
    spec = client.get("/openapi.json").json()
    assert {"/stylize", "/stylize/stream", "/healthz", "/readyz", "/v1/model", "/metrics"} <= set(spec["paths"])


@pytest.mark.slow
def test_load_test_script_reports_rate_latency_and_statuses(server):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "load_test.py"
    run = subprocess.run([sys.executable, str(script), "--url", server.url, "--concurrency", "2", "--seconds", "2",
                          "--api-key", KEY, "--json"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    s = json.loads(run.stdout)
    assert s["requests"] >= 1 and s["status_counts"].get("200", 0) >= 1
    assert s["requests_per_s"] > 0 and 0 < s["p50_ms"] <= s["p95_ms"] <= s["p99_ms"]
    text = subprocess.run([sys.executable, str(script), "--url", server.url, "--concurrency", "1", "--seconds", "1"],
                          capture_output=True, text=True, timeout=120).stdout
    assert "requests/s:" in text and "p99" in text and "401: " in text  # no key: every request refused


def test_a_chunked_upload_over_the_limit_is_cut_off_with_413(server):
    boundary = "b0undary"

    def body():
        yield (f"--{boundary}\r\nContent-Disposition: form-data; name=\"content\"; filename=\"c.png\"\r\n"
               "Content-Type: image/png\r\n\r\n").encode()
        for _ in range(MAX_UPLOAD // 65536 + 2):
            yield b"\x00" * 65536
        yield f"\r\n--{boundary}--\r\n".encode()

    r = httpx.post(server.url + "/stylize", content=body(), timeout=60,
                   headers={**AUTH, "Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert r.status_code == 413, r.text
    assert r.json() == {"error": "payload_too_large", "detail": f"request body is over the limit of {MAX_UPLOAD} "
                        "bytes (1.907 MiB), which the service's STYLEVAR_MAX_UPLOAD_BYTES sets"}


# ---- the documented curl commands -----------------------------------------------------------------------
def documented_curls() -> list[str]:
    """The curl commands of docs/serving.md's ```bash blocks (continuation lines joined)."""
    import re

    text = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text()
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```$", text, re.S | re.M):
        joined = block.replace("\\\n", " ")
        commands += [line.strip() for line in joined.splitlines() if line.strip().startswith("curl ")]
    return commands


def run_documented(command: str, server, tmp_path: Path, key: str | None = None) -> subprocess.CompletedProcess:
    """``command`` run by bash in ``tmp_path`` (beside the content.jpg and style.jpg it names) against ``server``,
    with ``key`` as a bearer token when given."""
    gradient(64, 48).save(tmp_path / "content.jpg")
    gradient(32, 32).save(tmp_path / "style.jpg")
    command = command.replace("http://127.0.0.1:8000", server.url)
    if key is not None:
        command = command.replace("curl ", f"curl -H 'Authorization: Bearer {key}' ", 1)
    return subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_the_documented_curl_commands_fail_visibly_on_an_error(server, tmp_path):
    """Each documented curl command asks curl to fail on an error answer; the first one, run as printed against a
    service with API keys (and without a key: 401), exits 22 and says so, the JSON error kept in out.png."""
    commands = documented_curls()
    assert len(commands) == 4 and all("--fail-with-body" in c for c in commands), commands
    done = run_documented(commands[0], server, tmp_path)
    assert done.returncode == 22 and "401" in done.stderr, (done.returncode, done.stderr)
    assert json.loads((tmp_path / "out.png").read_text())["error"] == "unauthorized"
    done = run_documented(commands[0], server, tmp_path, key=KEY)
    assert done.returncode == 0, done.stderr
    assert Image.open(tmp_path / "out.png").size == (64, 48)


@pytest.mark.skipif(shutil.which("curl") is None or shutil.which("jq") is None, reason="needs curl and jq")
def test_the_documented_jq_command_keeps_the_error_s_detail(server, tmp_path):
    """The JSON example piped into jq: an error's code and detail reach the terminal (a bare `.images[].seed`
    said only "Cannot iterate over null"), with a failing status; an answer gives its seeds."""
    piped = next(c for c in documented_curls() if "| jq" in c)
    done = run_documented(piped, server, tmp_path)
    detail = httpx.post(server.url + "/stylize").json()["detail"]
    assert done.returncode != 0 and f"unauthorized: {detail}" in done.stderr, (done.returncode, done.stderr)
    done = run_documented(piped, server, tmp_path, key=KEY)
    assert done.returncode == 0 and len(done.stdout.split()) == 4, (done.stdout, done.stderr)
