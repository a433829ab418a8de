"""Decoding bounded in work through the service (issue 55, finding 2 and 10; issue 56, item 5): a JPEG scan bomb sent
as the style twice, or as a video's style, is a 422 before it is decoded, and the next request is served; a camera's
MPO is accepted; a content over the pixel limit is halved while decoding, counted at that size in the memory budget,
and the answer says so with the line the command line prints."""
from __future__ import annotations

import io

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from serve.http import imaging
from serve.http.app import create_app
from serve.settings import ServeSettings
from stylevar.processing.decode_bounds import MAX_SCANS
from stylevar.processing.images import decode_image
from tests.processing.test_decode_bounds import scan_bomb
from tests.processing.test_images_decode import encode, noisy

MAX_PIXELS = 20_000
ORDINARY = encode(Image.new("RGB", (48, 32), (200, 120, 40)))


@pytest.fixture(scope="module")
def http(tiny_model_dir):
    settings = ServeSettings(model_dir=tiny_model_dir, device=["cpu"], ui=False, warmup=False, max_pixels=MAX_PIXELS,
                             max_output_side=512)
    with TestClient(create_app(settings)) as client:
        yield client


def test_a_scan_bomb_sent_as_the_style_twice_is_refused_and_the_next_request_served(http):
    bomb = scan_bomb(128, 5000)  # 5010 scans, 190 KB
    files = [("content", ("c.png", ORDINARY, "image/png")), ("style", ("a.jpg", bomb, "image/jpeg")),
             ("style", ("b.jpg", bomb, "image/jpeg"))]
    r = http.post("/stylize", files=files)
    assert (r.status_code, r.json()["error"]) == (422, "image_too_costly"), r.text
    assert r.json()["detail"] == f"style 1: JPEG image has more than {MAX_SCANS} scans (a progressive JPEG has " \
                                 "about 10; decoding time grows with each)"
    r = http.post("/stylize", files={"content": ("c.png", ORDINARY), "style": ("s.png", ORDINARY)})
    assert r.status_code == 200, r.text


def test_a_cameras_mpo_is_accepted(http):
    mpo = io.BytesIO()
    Image.new("RGB", (60, 40), (220, 20, 20)).save(mpo, "MPO", save_all=True,
                                                   append_images=[Image.new("RGB", (60, 40), (20, 20, 220))])
    r = http.post("/stylize", files={"content": ("c.jpg", mpo.getvalue(), "image/jpeg"), "style": ("s.png", ORDINARY)},
                  data={"resize": "pad"})
    assert r.status_code == 200, r.text
    assert Image.open(io.BytesIO(r.content)).size == (60, 40)


def test_a_content_over_the_pixel_limit_is_halved_and_the_answer_says_so(http):
    big = encode(Image.fromarray(noisy(301, 217)))  # 65,317 pixels: halved to 151 x 109 (16,459)
    for path in ("/stylize", "/stylize/stream"):
        r = http.post(path, files={"content": ("c.png", big), "style": ("s.png", ORDINARY)}, data={"resize": "pad"})
        assert r.status_code == 200, r.text
        assert r.headers[imaging.SHRUNK_HEADER] == decode_image(big, max_pixels=MAX_PIXELS).shrink_note("content") == \
               ("the content image is 301x217 = 65317 pixels, more than the limit of 20000: it was shrunk 2x while "
                "decoding, to 151x109")
    assert Image.open(io.BytesIO(http.post("/stylize", files={"content": ("c.png", big), "style": ("s.png", ORDINARY)},
                                           data={"resize": "pad"}).content)).size == (151, 109)
    small = http.post("/stylize", files={"content": ("c.png", ORDINARY), "style": ("s.png", ORDINARY)})
    assert imaging.SHRUNK_HEADER not in small.headers
    # a style over the limit is decoded small anyway (1024 px): nothing to say
    r = http.post("/stylize", files={"content": ("c.png", ORDINARY), "style": ("s.png", big)})
    assert r.status_code == 200 and imaging.SHRUNK_HEADER not in r.headers


def test_the_memory_budget_counts_a_content_at_its_halved_size():
    from serve.http.routes import stylize
    from stylevar.pipelines.request import StylizeRequest

    content = io.BytesIO(encode(Image.fromarray(noisy(301, 217))))
    plan = [("content", type("Upload", (), {"file": content})(), 512)]
    # 151 x 109 decoded and one result of the same size; at the default limit the whole 301 x 217, twice
    assert stylize.request_pixels(plan, StylizeRequest(resize="pad"), 512, MAX_PIXELS) == 2 * 151 * 109
    assert stylize.request_pixels(plan, StylizeRequest(resize="pad"), 512) == 2 * 301 * 217


def test_a_file_over_the_requests_pixels_is_refused_as_the_command_line_refuses_one(http, monkeypatch):
    state = http.app.state.service
    monkeypatch.setattr(state, "settings", state.settings.model_copy(update={"max_request_pixels": 1000}))
    r = http.post("/stylize", files={"content": ("c.png", ORDINARY), "style": ("s.png", ORDINARY)})
    assert r.status_code == 413 and r.json()["detail"] == \
        "content: image is 48x32 = 1536 pixels, more than the limit of 1000 (STYLEVAR_MAX_REQUEST_PIXELS)"


def test_a_scan_bomb_as_a_videos_style_is_refused(http, tmp_path):
    pytest.importorskip("av")
    from tests.processing.test_video_io import make_clip

    clip = make_clip(tmp_path / "c.mp4", frames=2).read_bytes()
    r = http.post("/stylize/video", files={"video": ("c.mp4", clip, "video/mp4"),
                                           "style": ("s.jpg", scan_bomb(128, 5000), "image/jpeg")})
    assert (r.status_code, r.json()["error"]) == (422, "image_too_costly"), r.text


@pytest.mark.slow
def test_the_command_line_shrinks_a_photo_over_the_limit_and_prints_the_services_line(micro_model_dir, tmp_path,
                                                                                      capsys):
    """At the default limit (40 MP), as both surfaces run: a 6400 x 6400 PNG (41 MP) comes back at 3200 x 3200 from
    `stylevar stylize`, with the note the service sends as X-Content-Shrunk for the same bytes."""
    from stylevar import cli
    from stylevar.processing.images import DEFAULT_MAX_PIXELS
    from tests.processing.test_images_decode import solid_png

    big = tmp_path / "big.png"
    solid_png(big, 6400, 6400)
    Image.new("RGB", (32, 32), (20, 30, 200)).save(tmp_path / "s.png")
    rc = cli.main(["stylize", str(big), str(tmp_path / "s.png"), "-o", str(tmp_path / "out.jpg"),
                   "--model", str(micro_model_dir), "--device", "cpu", "--upsample", "bicubic"])
    assert rc == 0
    assert Image.open(tmp_path / "out.jpg").size == (3200, 3200)
    service = imaging.decode_upload(big.read_bytes(), max_pixels=DEFAULT_MAX_PIXELS, max_side=8192)
    line = imaging.shrink_headers(service)[imaging.SHRUNK_HEADER]
    assert line == "the content image is 6400x6400 = 40960000 pixels, more than the limit of 40000000: it was " \
                   "shrunk 2x while decoding, to 3200x3200"
    assert f"note: {big}: {line}" in capsys.readouterr().err.splitlines()
