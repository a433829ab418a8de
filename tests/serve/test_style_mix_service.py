"""Several styles, masks and guidance through /stylize and /stylize/stream, in-process against the
micro model: every new field's bad input is a 4xx JSON error, the neutral values give the plain result."""
from __future__ import annotations

import io

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from serve.http.app import create_app
from serve.settings import ServeSettings
from tests.serve.test_openapi import form as openapi_form


def encode(img: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt)
    return buf.getvalue()


def noise(w: int, h: int, seed: int) -> Image.Image:
    return Image.effect_noise((w, h), 60 + 20 * seed).convert("RGB").rotate(15 * seed)


CONTENT = encode(noise(48, 32, 1))
STYLE_A = encode(Image.merge("RGB", [noise(40, 40, 2).getchannel(0), Image.new("L", (40, 40), 30),
                                     Image.new("L", (40, 40), 200)]))
STYLE_B = encode(noise(30, 50, 3))
WHITE = encode(Image.new("L", (7, 5), 255))  # any size: resized to the content's
HALF = encode(Image.new("L", (48, 32), 0).crop((0, 0, 48, 32)))
TRUNCATED = encode(noise(40, 40, 4))[:200]


def form(styles=(STYLE_A,), masks=()) -> list:
    parts = [("content", ("c.png", CONTENT, "image/png"))]
    parts += [("style", (f"s{i}.png", s, "image/png")) for i, s in enumerate(styles)]
    parts += [("style_mask", (f"m{i}.png", m, "image/png")) for i, m in enumerate(masks)]
    return parts


@pytest.fixture(scope="module")
def http(micro_model_dir):
    settings = ServeSettings(model_dir=micro_model_dir, device=["cpu"], ui=False, warmup=False, queue_size=8,
                             max_output_side=256)
    with TestClient(create_app(settings)) as client:
        yield client


BAD = {
    "weights count": (form((STYLE_A, STYLE_B)), {"style_weights": "1"}, 422, "validation_error", "1 weights for 2"),
    "weights for one style": (form(), {"style_weights": "0.5,0.5"}, 422, "validation_error", "2 weights for 1"),
    "masks count": (form((STYLE_A, STYLE_B), (WHITE,)), {}, 422, "validation_error", "1 masks for 2"),
    "masks without enough styles": (form((STYLE_A,), (WHITE, WHITE)), {}, 422, "validation_error", "2 masks for 1"),
    "weights text": (form((STYLE_A, STYLE_B)), {"style_weights": "a,b"}, 422, "validation_error", "style_weights"),
    "weights negative": (form((STYLE_A, STYLE_B)), {"style_weights": "1,-1"}, 422, "validation_error", ">= 0"),
    "weights all zero": (form((STYLE_A, STYLE_B)), {"style_weights": "0,0"}, 422, "validation_error", "not all 0"),
    "weights nan": (form((STYLE_A, STYLE_B)), {"style_weights": "nan,1"}, 422, "validation_error", "finite"),
    # finite as Python floats, not in float32, the model's precision: refused before admission
    "weights past float32": (form((STYLE_A, STYLE_B)), {"style_weights": "1e39,1"}, 422, "validation_error", "float32"),
    "weights below float32": (form((STYLE_A, STYLE_B)), {"style_weights": "1e-320,0"}, 422, "validation_error",
                              "not all 0"),
    "weights sum past float32": (form((STYLE_A, STYLE_B)), {"style_weights": "3e38,3e38"}, 422, "validation_error",
                                 "float32"),
    "too many styles": (form((STYLE_A,) * 5), {}, 422, "validation_error", "1 to 4 style images"),
    "mask undecodable": (form((STYLE_A,), (TRUNCATED,)), {}, 422, "corrupt_image", "style_mask:"),
    "mask not an image": (form((STYLE_A, STYLE_B), (WHITE, b"just text")), {}, 415, "not_an_image",
                          "style_mask 2:"),
    "second style undecodable": (form((STYLE_A, TRUNCATED)), {}, 422, "corrupt_image", "style 2:"),
    "guidance negative": (form(), {"guidance": "-1"}, 422, "validation_error", "guidance"),
    "guidance too large": (form(), {"guidance": "11"}, 422, "validation_error", "guidance"),
    "guidance nan": (form(), {"guidance": "nan"}, 422, "validation_error", "guidance"),
    "guidance text": (form(), {"guidance": "lots"}, 422, "validation_error", "guidance"),
}


@pytest.mark.parametrize("route", ["/stylize", "/stylize/stream"])
@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_mix_fields_are_4xx_json(http, route, case):
    files, data, status, code, detail = BAD[case]
    r = http.post(route, files=files, data=data)
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "detail"} and body["error"] == code and detail in body["detail"], body


def stylize(http, files, **data) -> bytes:
    r = http.post("/stylize", files=files, data={"seed": "11", **{k: str(v) for k, v in data.items()}})
    assert r.status_code == 200, r.text
    return r.content


def test_neutral_values_give_the_plain_result(http):
    plain = stylize(http, form())
    assert stylize(http, form(), style_weights="1") == plain
    assert stylize(http, form((STYLE_A, STYLE_B)), style_weights="[1, 0]") == plain
    assert stylize(http, form((STYLE_A,), (WHITE,))) == plain
    assert stylize(http, form(), guidance=0) == plain


def test_a_masked_guided_blend_is_served_in_the_content_frame(http):
    data = stylize(http, form((STYLE_A, STYLE_B), (HALF, WHITE)), style_weights="0.7,0.3", guidance=1.5,
                   resize="pad")
    with Image.open(io.BytesIO(data)) as im:
        assert im.size == (48, 32)
    r = http.post("/stylize/stream", files=form((STYLE_A, STYLE_B), (WHITE, HALF)), data={"guidance": "1"})
    assert r.status_code == 200 and "event: result" in r.text


def test_openapi_documents_the_new_fields(http):
    spec = http.get("/openapi.json").json()
    for route in ("/stylize", "/stylize/stream"):
        props = openapi_form(spec, route)["properties"]
        assert props["style"]["type"] == "array" and "repeat the field" in props["style"]["description"]
        assert "mask" in str(props["style_mask"]) and "white" in str(props["style_mask"])
    form_props = openapi_form(spec, "/stylize")["properties"]
    assert "one weight" in str(form_props["style_weights"]) and form_props["guidance"]["maximum"] == 10
    assert "without the style" in form_props["guidance"]["description"]
