"""The options of `POST /stylize` through the Python API and the command line, and the response format
rule of `/stylize` (docs/serving.md, "Response format")."""
from __future__ import annotations

import base64
import io
import zipfile

import httpx
import numpy as np
import pytest
import torch
from PIL import Image
from starlette.requests import Request

from serve.engine.runner import ModelRunner, RunnerOptions
from serve.http.errors import ServiceError
from serve.http.negotiation import negotiate
from serve.settings import ServeSettings
from serve.testing import ServerProcess
from stylevar import cli
from stylevar.processing.postprocess import os_random_seed, sample_seeds


def png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def gradient(w: int, h: int) -> Image.Image:
    x = np.linspace(0, 255, w, dtype=np.float32)[None, :].repeat(h, 0)
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None].repeat(w, 1)
    return Image.fromarray(np.stack([x, y, 255 - x], -1).astype(np.uint8), "RGB")


CONTENT = gradient(90, 60)  # 3:2, smaller than the service's output limit: decoded as is
STYLE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (56, 40, 3), dtype=np.uint8), "RGB")
FILES = {"content": ("c.png", png(CONTENT), "image/png"), "style": ("s.png", png(STYLE), "image/png")}


def decode(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    srv = ServerProcess.serve(tiny_model_dir, log_dir=tmp_path_factory.mktemp("logs"))
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def pipe(tiny_model_dir):
    """The pipeline as the service loads it on the CPU (prepared by stylevar.runtime.inference: equal to the plain
    model up to float rounding, which can change a sampled token), so that only the options differ."""
    return ModelRunner.load(tiny_model_dir, torch.device("cpu"), RunnerOptions.from_settings(ServeSettings())).pipe


# ---- the Python API gives what the service gives ---------------------------------------------------------
# (one_thread: the test service computes with one torch thread, serve.testing; so does the Python side)
@pytest.mark.slow
def test_python_api_equals_the_service_for_several_samples_with_preserved_colour(http, pipe, one_thread):
    form = {"seed": "40", "num_samples": "3", "preserve_color": "true", "resize": "pad", "style_strength": "0.5",
            "top_k": "50"}
    r = http.post("/stylize", files=FILES, data=form, headers={"Accept": "application/json"})
    assert r.status_code == 200, r.text
    served = [decode(base64.b64decode(im["data"])) for im in r.json()["images"]]
    ours = pipe(CONTENT, STYLE, seed=40, num_samples=3, preserve_color=True, resize="pad", style_strength=0.5,
                top_k=50, max_side=1024)
    assert isinstance(ours, list) and len(ours) == 3
    for mine, theirs in zip(ours, served):
        assert mine.size == (90, 60)
        assert np.array_equal(np.asarray(mine), theirs)
    assert not np.array_equal(served[0], served[1]), "samples 40 and 41 differ"
    plain = pipe(CONTENT, STYLE, seed=40, num_samples=3, resize="pad", style_strength=0.5, top_k=50)
    assert not np.array_equal(np.asarray(plain[0]), served[0]), "preserve_color changed the result"


def test_python_api_default_is_one_image_equal_to_the_service_image(http, pipe, one_thread):
    r = http.post("/stylize", files=FILES, data={"seed": "7", "resize": "crop"})  # curl's Accept: */*
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    mine = pipe(CONTENT, STYLE, seed=7, resize="crop")
    assert isinstance(mine, Image.Image) and mine.size == (60, 60)
    assert np.array_equal(np.asarray(mine), decode(r.content))


def test_python_api_takes_paths_and_names_what_it_cannot_take(pipe, tmp_path, one_thread):
    CONTENT.save(tmp_path / "c.png")
    STYLE.save(tmp_path / "s.png")
    from_files = pipe(str(tmp_path / "c.png"), tmp_path / "s.png", seed=0)  # a str and a Path
    assert np.array_equal(np.asarray(from_files), np.asarray(pipe(CONTENT, STYLE, seed=0)))
    two = pipe(tmp_path / "c.png", [tmp_path / "s.png", STYLE], style_weights=[1, 1], seed=0)
    assert two.size == CONTENT.size
    [batch] = pipe.stylize_batch([tmp_path / "c.png"], [str(tmp_path / "s.png")], seeds=[0])
    assert batch.size == CONTENT.size
    with pytest.raises(TypeError, match=r"^content: expected a PIL image or the path of one, not ndarray "
                                        r"\(an array: PIL.Image.fromarray\(array\)\)$"):
        pipe(np.asarray(CONTENT), STYLE)
    with pytest.raises(TypeError, match=r"^style 2: expected a PIL image or the path of one, not int$"):
        pipe(CONTENT, [STYLE, 3])
    with pytest.raises(FileNotFoundError, match="nope.png"):
        pipe(CONTENT, tmp_path / "nope.png")
    with pytest.raises(ValueError, match=r"^style image http://example.com/s.jpg is a web address: StyleVAR reads "
                                         r"files only; download it first$"):
        pipe(CONTENT, "http://example.com/s.jpg")


@pytest.mark.slow
def test_python_api_output_size_limit(pipe):
    big = CONTENT.resize((900, 600))
    assert pipe(big, STYLE, seed=0).size == (900, 600)
    assert pipe(big, STYLE, seed=0, max_side=128).size == (128, 85)
    assert [im.size for im in pipe(big, STYLE, seed=0, num_samples=2, max_side=64, resize="crop")] == [(64, 64)] * 2
    with pytest.raises(ValueError, match="max_side"):
        pipe(big, STYLE, seed=0, max_side=0)


def test_seeds_without_a_seed():
    # the library follows torch's global generator (repeatable with torch.manual_seed) ...
    torch.manual_seed(5)
    first = sample_seeds(None, 3)
    torch.manual_seed(5)
    assert sample_seeds(None, 3) == first and first[1:] == [first[0] + 1, first[0] + 2]
    # ... while the service draws from the OS: torch's generator starts alike in every replica
    torch.manual_seed(5)
    a = os_random_seed()
    torch.manual_seed(5)
    assert os_random_seed() != a  # equal with probability 2**-32
    with pytest.raises(ValueError, match="num_samples"):
        sample_seeds(0, 0)


# ---- the response format rule ----------------------------------------------------------------------------
def test_several_samples_with_curls_default_accept_are_a_zip_of_the_json_images(http):
    form = {"seed": "40", "num_samples": "2", "format": "webp"}
    r = http.post("/stylize", files=FILES, data=form, headers={"Accept": "*/*"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/zip"
    assert r.headers["content-disposition"] == 'attachment; filename="stylevar-seed-40.zip"'
    assert r.headers["x-seed"] == "40" and "accept" in r.headers["vary"].lower()
    with zipfile.ZipFile(io.BytesIO(r.content)) as archive:
        assert archive.namelist() == ["seed-40.webp", "seed-41.webp"]
        files = [archive.read(name) for name in archive.namelist()]
    as_json = http.post("/stylize", files=FILES, data=form, headers={"Accept": "application/json"}).json()
    assert [base64.b64decode(im["data"]) for im in as_json["images"]] == files


def request_with(accept: str | None) -> Request:
    headers = [] if accept is None else [(b"accept", accept.encode())]
    return Request({"type": "http", "method": "POST", "path": "/stylize", "headers": headers})


@pytest.mark.parametrize("accept,num_samples,expected", [
    (None, 1, "image"),
    ("*/*", 1, "image"),
    ("image/*", 1, "image"),
    ("application/json", 1, "json"),
    ("application/json, */*", 1, "json"),
    ("image/png, application/json;q=0.5", 1, "image"),
    ("application/*", 1, 406),  # JSON only when named
    ("image/jpeg", 1, 406),
    (None, 3, "zip"),
    ("*/*", 3, "zip"),
    ("application/zip", 3, "zip"),
    ("application/json", 3, "json"),
    ("*/*, application/json", 3, "json"),
    ("application/zip, application/json;q=0.9", 3, "zip"),
    ("image/png", 3, 406),
    ("application/zip", 1, 406),
])
def test_response_format_rule(accept, num_samples, expected):
    if expected == 406:
        with pytest.raises(ServiceError) as e:
            negotiate(request_with(accept), "image/png", num_samples)
        assert e.value.status == 406 and e.value.code == "not_acceptable"
    else:
        assert negotiate(request_with(accept), "image/png", num_samples) == expected


def test_several_samples_as_one_image_is_a_406_over_http(http):
    r = http.post("/stylize", files=FILES, data={"num_samples": "2"}, headers={"Accept": "image/png"})
    assert r.status_code == 406 and r.json()["error"] == "not_acceptable"
    assert "application/zip" in r.json()["detail"]


# ---- the command line's output size ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("max-size")
    CONTENT.resize((300, 200)).save(d / "c.png")
    STYLE.save(d / "s.png")
    return d


@pytest.mark.slow
@pytest.mark.parametrize("extra,size,factor", [
    ([], (300, 200), "4.7x"),  # default: the content's size, as the Python API and the service
    (["--max-size", "256"], (256, 171), "4.0x"),
    (["--max-size", "1000"], (300, 200), "4.7x"),  # never larger than the content
    (["--max-size", "64"], (64, 43), None),
    (["--max-size", "48", "--resize", "crop"], (48, 48), None),
])
def test_cli_max_size_and_upscale_note(tiny_model_dir, inputs, tmp_path, capsys, extra, size, factor):
    out = tmp_path / "o.png"
    rc = cli.main(["stylize", str(inputs / "c.png"), str(inputs / "s.png"), "-o", str(out), "--model",
                   str(tiny_model_dir), "--device", "cpu", *extra])
    assert rc == 0
    captured = capsys.readouterr()
    with Image.open(out) as im:
        assert im.size == size
    assert f"wrote {out} ({size[0]}x{size[1]})" in captured.out
    assert captured.out.startswith("loaded tiny-test: 64 px, 6 scales, ")  # what the command loaded
    if factor is None:
        assert "upscaled" not in captured.err
    else:
        assert f"note: the model draws 64x64 pixels; the result is upscaled {factor}" in captured.err


def test_cli_max_size_must_be_positive(inputs, tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["stylize", str(inputs / "c.png"), str(inputs / "s.png"), "-o", str(tmp_path / "o.png"),
                  "--max-size", "0"])
    assert done.value.code == 2
    assert "--max-size: must be an integer >= 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["guided", "bicubic"])
def test_upsample_option_through_the_service_equals_the_python_api(http, pipe, one_thread, mode):
    big = CONTENT.resize((360, 240))
    files = {**FILES, "content": ("c.png", png(big), "image/png")}
    r = http.post("/stylize", files=files, data={"seed": "5", "upsample": mode})
    assert r.status_code == 200, r.text
    served = decode(r.content)
    assert served.shape == (240, 360, 3)
    assert np.array_equal(np.asarray(pipe(big, STYLE, seed=5, upsample=mode)), served)
    other = pipe(big, STYLE, seed=5, upsample="bicubic" if mode == "guided" else "guided")
    assert not np.array_equal(np.asarray(other), served)


def test_upsample_bad_value_is_a_422_naming_the_field(http):
    r = http.post("/stylize", files=FILES, data={"upsample": "lanczos"})
    assert r.status_code == 422 and "upsample" in r.text


@pytest.mark.slow
def test_a_24_megapixel_content_comes_back_at_full_size(http):
    big = gradient(600, 400).resize((6000, 4000), Image.BICUBIC)
    buf = io.BytesIO()
    big.save(buf, format="JPEG", quality=90)
    files = {**FILES, "content": ("big.jpg", buf.getvalue(), "image/jpeg")}
    r = http.post("/stylize", files=files, data={"seed": "1", "format": "jpeg"}, timeout=120)
    assert r.status_code == 200, r.text
    with Image.open(io.BytesIO(r.content)) as im:
        assert im.size == (6000, 4000)


def test_the_answer_says_what_the_model_drew(http):
    big = CONTENT.resize((512, 341))
    files = {**FILES, "content": ("c.png", png(big), "image/png")}
    r = http.post("/stylize", files=files, data={"seed": "2", "upsample": "bicubic"})
    assert r.status_code == 200
    assert (r.headers["X-Model-Size"], r.headers["X-Upscale"], r.headers["X-Upsample"]) == ("64", "8.000", "bicubic")
    j = http.post("/stylize", files=files, data={"seed": "2"}, headers={"Accept": "application/json"}).json()
    assert j["model_size"] == 64 and j["upsample"] == "guided" and j["images"][0]["upscale"] == 8.0
