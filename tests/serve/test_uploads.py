"""Hostile uploads against the app in-process (a tiny random model, no warm-up): decoder and form-parser
failures are 4xx JSON, large images are decoded downscaled, a full queue answers 503 before any image is
decoded, and only `decode_concurrency` decodes run at once."""
from __future__ import annotations

import asyncio
import io
import struct
import threading
import time
import zlib

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from serve.http import imaging
from serve.http.app import create_app
from serve.settings import ServeSettings
from stylevar.processing.images import Decoded


def encode(img: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def solid_png(w: int, h: int, rgb: tuple[int, int, int]) -> bytes:
    """A solid-colour PNG built without holding the image: tiny on the wire, w*h*3 bytes of pixels."""
    row = b"\x00" + bytes(rgb) * w
    z = zlib.compressobj(9)
    idat = b"".join(z.compress(row) for _ in range(h)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


CONTENT = encode(Image.new("RGB", (48, 32), (200, 120, 40)))
STYLE = encode(Image.new("RGB", (40, 40), (20, 60, 200)))


def files(content: bytes = CONTENT, style: bytes = STYLE) -> dict:
    return {"content": ("c.png", content, "image/png"), "style": ("s.png", style, "image/png")}


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir


@pytest.fixture(scope="module")
def http(model_dir):
    settings = ServeSettings(model_dir=model_dir, device=["cpu"], ui=False, warmup=False, queue_size=3,
                             max_upload_bytes=5_000_000, max_output_side=512, max_whole_decode_pixels=1_000_000)
    with TestClient(create_app(settings)) as client:
        yield client


def test_a_png_text_chunk_over_pillows_limit_is_422(http):
    bomb = CONTENT[:33] + chunk(b"zTXt", b"k\x00\x00" + zlib.compress(b"a" * (2 << 20))) + CONTENT[33:]
    r = http.post("/stylize", files=files(content=bomb))
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "corrupt_image" and r.json()["detail"].startswith("content: corrupt or unreadable")


def test_alphas_nested_1000_deep_are_422(http):
    r = http.post("/stylize", files=files(), data={"alphas": "[" * 1000 + "]" * 1000})
    assert r.status_code == 422 and r.json()["error"] == "validation_error"
    r = http.post("/stylize", files=files(), data={"alphas": "[" * 5000 + "]" * 5000})
    assert r.status_code == 422 and r.json()["error"] == "validation_error"


def test_a_36_megapixel_upload_is_decoded_downscaled(http):
    big = solid_png(6000, 4000, (30, 160, 90))
    assert len(big) < 200_000
    r = http.post("/stylize", files=files(content=big, style=big), data={"preserve_color": "true"})
    assert r.status_code == 200, r.text
    out = Image.open(io.BytesIO(r.content))
    assert out.size == (512, 341)  # the content's aspect ratio at max_output_side, as before


def test_the_service_says_when_it_caps_the_result_s_size(http):
    """A panorama over max_output_side (512 here; 8192 by default) comes back capped, and X-Size-Capped says so: the
    content's size and the result's, the form of the command line's --max-size note."""
    wide = solid_png(2000, 100, (30, 160, 90))
    r = http.post("/stylize", files=files(content=wide))
    assert r.status_code == 200, r.text
    out = Image.open(io.BytesIO(r.content))
    assert out.size == (512, 26) and r.headers["X-Size-Capped"] == "2000x100->512x26"
    with http.stream("POST", "/stylize/stream", files=files(content=wide)) as streamed:
        assert streamed.status_code == 200 and streamed.headers["X-Size-Capped"] == "2000x100->512x26"
        streamed.read()
    r = http.post("/stylize", files=files())
    assert r.status_code == 200 and "X-Size-Capped" not in r.headers  # 48 x 32: nothing capped


def test_images_decoded_at_full_size_have_their_own_limit(http):
    webp = encode(Image.new("RGB", (1200, 1000), (1, 2, 3)), "WEBP")
    r = http.post("/stylize", files=files(style=webp))
    assert r.status_code == 413 and r.json()["error"] == "image_too_large"
    assert r.json()["detail"].startswith("style: ") and "WebP" in r.json()["detail"]


def test_the_pixels_of_all_a_requests_images_are_bounded_together(http, monkeypatch):
    """One request's decoding is bounded across its file fields (max_request_pixels, from the headers):
    the content (1536 pixels) fits, the style (1600) would take the request over 3000 and is refused unread."""
    state = http.app.state.service
    decoded = []
    real = imaging.decode_upload
    monkeypatch.setattr(imaging, "decode_upload", lambda data, **kw: decoded.append(len(data)) or real(data, **kw))
    monkeypatch.setattr(state, "settings", state.settings.model_copy(update={"max_request_pixels": 3000}))
    r = http.post("/stylize", files=files())
    assert r.status_code == 413 and r.json()["error"] == "image_too_large", r.text
    assert r.json()["detail"].startswith("style: ") and "3000 pixels in all" in r.json()["detail"]
    assert decoded == [len(CONTENT)], "the style is refused from its header, before decoding"
    monkeypatch.setattr(state, "settings", state.settings.model_copy(update={"max_request_pixels": 3136}))
    assert http.post("/stylize", files=files()).status_code == 200


def test_a_full_queue_answers_503_before_decoding(http, monkeypatch):
    state = http.app.state.service
    decoded = []

    async def decode(data: bytes, *, max_side: int, budget=None) -> Decoded:
        decoded.append(len(data))
        return Decoded(Image.new("RGB", (8, 8)), (8, 8))

    monkeypatch.setattr(state.decoder, "decode", decode)
    held = [state.batcher.admit() for _ in range(state.settings.queue_size)]  # requests still decoding
    try:
        t0 = time.perf_counter()
        r = http.post("/stylize", files=files(content=solid_png(6000, 6000, (1, 1, 1))))
        elapsed = time.perf_counter() - t0
        assert r.status_code == 503 and r.json()["error"] == "queue_full", r.text
        assert int(r.headers["retry-after"]) >= 1
        assert decoded == [], "nothing is decoded for a request the queue cannot take"
        assert elapsed < 5  # no decode: the time is the upload's (a generous bound for a shared machine)
    finally:
        for admission in held:
            admission.release()
    assert http.post("/stylize", files=files()).status_code == 200
    assert len(decoded) == 2


def test_a_full_queue_answers_503_without_parsing_the_form(http, monkeypatch):
    """The 503 of a full queue does no work that grows with load: the body is read and dropped (so the
    connection closes cleanly), never parsed as a form."""
    from starlette.requests import Request

    state = http.app.state.service
    parsed = []
    monkeypatch.setattr(Request, "form", lambda self, **kw: parsed.append(1))
    messages = [{"type": "http.request", "body": b"x" * 400, "more_body": True},
                {"type": "http.request", "body": b"x" * 600, "more_body": False}]
    reads, sent = [], []

    async def receive() -> dict:
        reads.append(1)
        return messages[len(reads) - 1] if len(reads) <= len(messages) else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/stylize", "raw_path": b"/stylize", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"multipart/form-data; boundary=b"), (b"content-length", b"1000")],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80)}
    held = [state.batcher.admit() for _ in range(state.settings.queue_size)]
    try:
        asyncio.run(asyncio.wait_for(http.app(scope, receive, send), 10))
    finally:
        for admission in held:
            admission.release()
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = dict(start["headers"])
    assert start["status"] == 503 and int(headers[b"retry-after"]) >= 1 and headers[b"connection"] == b"close"
    assert b"queue_full" in b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert len(reads) == 2 and not parsed, "the body was read to its end and dropped, never parsed"


def test_decodes_run_at_most_decode_concurrency_at_once(monkeypatch):
    running, peak, lock = 0, 0, threading.Lock()

    def slow_decode(data: bytes, **kw) -> Decoded:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        return Decoded(Image.new("RGB", (4, 4)), (4, 4))

    monkeypatch.setattr(imaging, "decode_upload", slow_decode)
    decoder = imaging.UploadDecoder(max_pixels=100, max_whole_pixels=100, concurrency=2)

    async def many() -> None:
        await asyncio.gather(*[decoder.decode(b"x", max_side=64) for _ in range(8)])

    asyncio.run(many())
    assert peak == 2
