"""The OpenAPI document as generated clients read it (serve/http/openapi.py, the routes' declarations): plain
upload forms with binary files, the service's limits in JSON Schema's words, examples and patterns the service
takes, the answers' media types and headers, the security as configured, error names that are the form's."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.requests import Request
from starlette.testclient import TestClient

from serve.http.app import create_app
from serve.http.errors import ServiceError
from serve.http.negotiation import BYTES_MEDIA_TYPE, binary_media, negotiate
from serve.http.routes.stylize import check_alphas, check_mix
from serve.http.schemas import HEADERS, StylizeForm
from serve.settings import ServeSettings
from stylevar.config import presets
from stylevar.pipelines.request import StylizeRequest
from stylevar.processing.postprocess import MAX_SEED, MAX_STYLES

SCALES = len(presets("tiny")[1].patch_nums)  # the tiny model's (tests/conftest.py `tiny_model_dir`)
FILE_FIELDS = ("content", "style", "style_mask", "video")
UPLOADS = ("/stylize", "/stylize/stream", "/stylize/video")
KEYED = UPLOADS + ("/v1/model", "/metrics")


@pytest.fixture(scope="module")
def documents(tiny_model_dir) -> dict[bool, dict]:
    """The served document with API keys (True) and without (False)."""
    def document(keys: list[str]) -> dict:
        app = create_app(ServeSettings(model_dir=tiny_model_dir, ui=False, api_keys=keys, metrics_access="key"))
        return app.openapi()

    return {True: document(["k1"]), False: document([])}


@pytest.fixture(scope="module")
def spec(documents) -> dict:
    return documents[True]


def form(spec: dict, path: str) -> dict:
    body = spec["paths"][path]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    return spec["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]


def walk(node: Any):
    """Every dict in a JSON document, with its key path."""
    stack = [((), node)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, dict):
            yield path, item
            stack += [((*path, k), v) for k, v in item.items()]
        elif isinstance(item, list):
            stack += [((*path, i), v) for i, v in enumerate(item)]


def test_each_upload_form_is_one_plain_object_with_binary_files(spec):
    for path in UPLOADS:
        body = form(spec, path)
        assert "allOf" not in body and body["type"] == "object", path
        props = body["properties"]
        assert {"style", "style_mask", "seed", "alphas", "style_weights"} <= set(props), path
        assert {"content", "video"} & set(props), path
        for name in FILE_FIELDS:
            if name in props:
                file = props[name].get("items", props[name])
                assert (file["type"], file["format"]) == ("string", "binary"), (path, name)
        assert not [p for p, node in walk(body) if "anyOf" in node or node.get("type") == "null"], path
    assert not {"StylizeForm", "VideoForm"} & set(spec["components"]["schemas"])  # merged, not left behind
    ops = {path: op["operationId"] for path, item in spec["paths"].items() for op in item.values()}
    assert ops["/stylize"] == "stylize" and ops["/stylize/video"] == "stylize_video"  # a client's function names


def test_the_service_limits_are_in_json_schema_words(spec):
    assert not [p for p, node in walk(spec) if {"ge", "le"} & set(node) and "properties" not in p[-1:]]
    for path in UPLOADS:
        props = form(spec, path)["properties"]
        assert (props["seed"]["minimum"], props["seed"]["maximum"]) == (0, MAX_SEED)
        assert (props["top_k"]["minimum"], props["top_k"]["maximum"]) == (0, 1_000_000)
        assert (props["top_p"]["minimum"], props["top_p"]["maximum"]) == (0, 1)
        assert (props["style"]["minItems"], props["style"]["maxItems"]) == (1, MAX_STYLES)
        assert props["style_mask"]["type"] == "array" and props["style_mask"]["maxItems"] == MAX_STYLES
        assert set(props["resize"]["enum"]) == {"stretch", "pad", "crop"}
        assert "pattern" in props["alphas"] and "pattern" in props["style_weights"]
    assert form(spec, "/stylize")["properties"]["num_samples"]["maximum"] == 4


def form_values(props: dict) -> dict[str, Any]:
    return {name: prop["examples"][0] for name, prop in props.items() if "examples" in prop}


def test_every_example_in_the_document_is_one_the_service_takes(spec):
    examples = [node for path, node in walk(spec) if "examples" in node and "properties" in path[-2:-1]]
    assert examples  # alphas and style_weights have one
    for path in UPLOADS:
        values = form_values(form(spec, path)["properties"])
        req = StylizeForm(**values).request()  # the form's own checks
        check_alphas(req.alphas, SCALES)  # one alpha per scale of the served model
        check_mix([object()], None, req.style_weights)  # the example request has one style


def admitted(pattern: str, text: str) -> bool:
    return re.search(pattern, text) is not None


def test_the_list_patterns_admit_what_the_service_takes_and_not_what_it_refuses(spec):
    props = form(spec, "/stylize")["properties"]
    alphas, weights = props["alphas"]["pattern"], props["style_weights"]["pattern"]
    assert admitted(alphas, ",".join(["0.5"] * SCALES)) and admitted(alphas, f"[{', '.join(['1'] * SCALES)}]")
    for refused in (",".join(["0.5"] * (SCALES - 1)), ",".join(["0.5"] * (SCALES + 1)), ",".join(["2"] * SCALES)):
        assert not admitted(alphas, refused), refused
    assert admitted(weights, "0.7,0.3") and admitted(weights, "0,0,0,1") and admitted(weights, "")
    for refused in ("0,0", "0", "1,1,1,1,1", "-1", "1e3", "a"):
        assert not admitted(weights, refused), refused

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.from_regex(alphas), st.from_regex(weights))
    def taken(alphas_text: str, weights_text: str) -> None:
        req = StylizeRequest.of(alphas=alphas_text, style_weights=weights_text)
        check_alphas(req.alphas, SCALES)

    taken()


def test_every_answer_declares_the_headers_it_carries(spec):
    for path, item in spec["paths"].items():
        for op in item.values():
            for status, answer in op["responses"].items():
                assert answer["headers"]["X-Request-ID"]["required"], (path, status)
                if status in ("429", "503"):
                    assert "Retry-After" in answer["headers"], (path, status)
    image = spec["paths"]["/stylize"]["post"]["responses"]["200"]["headers"]
    assert {"X-Seed", "X-Model", "X-Model-Size", "X-Upscale", "X-Upsample", "X-Inference-Ms",
            "X-Content-Shrunk", "Content-Disposition"} <= set(image)
    assert image["X-Seed"]["schema"]["maximum"] == MAX_SEED and not image["Content-Disposition"]["required"]
    clip = spec["paths"]["/stylize/video"]["post"]["responses"]["200"]["headers"]
    assert {"X-Seed", "X-Frames", "X-Fps", "X-Temporal", "X-Audio", "X-Model"} <= set(clip)
    assert {"X-Seed", "X-Model"} <= set(spec["paths"]["/stylize/stream"]["post"]["responses"]["200"]["headers"])


def test_every_header_the_service_names_is_declared():
    source = "\n".join(p.read_text() for p in Path(__file__).parents[2].joinpath("serve").rglob("*.py"))
    named = set(re.findall(r'"(X-[A-Za-z-]+|Retry-After|Content-Disposition)"', source))
    assert named and not named - set(HEADERS), named - set(HEADERS)


def test_a_page_on_an_allowed_origin_reads_every_declared_header(tiny_model_dir):
    app = create_app(ServeSettings(model_dir=tiny_model_dir, ui=False, cors_origins=["https://app.example"]))
    answer = TestClient(app).get("/healthz", headers={"Origin": "https://app.example"})  # no lifespan: no model
    exposed = {name.strip() for name in answer.headers["access-control-expose-headers"].split(",")}
    assert exposed == set(HEADERS)


def test_binary_answers_are_declared_as_bytes_too(spec):
    image = list(spec["paths"]["/stylize"]["post"]["responses"]["200"]["content"])
    assert {"image/png", "image/jpeg", "image/webp", "application/zip", "application/json"} <= set(image)
    # a generator that reads one media type per answer reads these as bytes: JSON comes after them
    assert image.index(BYTES_MEDIA_TYPE) < image.index("application/json")
    clip = spec["paths"]["/stylize/video"]["post"]["responses"]["200"]["content"]
    assert set(clip) == {"video/mp4", BYTES_MEDIA_TYPE}
    event = spec["paths"]["/stylize/stream"]["post"]["responses"]["200"]["content"]["text/event-stream"]
    assert event["itemSchema"]["properties"]["event"]["enum"] == ["preview", "result", "error"]


def request_accepting(accept: str | None) -> Request:
    headers = [] if accept is None else [(b"accept", accept.encode())]
    return Request({"type": "http", "method": "POST", "path": "/stylize", "headers": headers})


@pytest.mark.parametrize("accept, samples, representation, media", [
    (None, 1, "image", "image/png"),
    (BYTES_MEDIA_TYPE, 1, "image", BYTES_MEDIA_TYPE),
    (BYTES_MEDIA_TYPE, 2, "zip", BYTES_MEDIA_TYPE),
    ("image/png, application/octet-stream;q=0.5", 1, "image", "image/png"),
    ("application/json, application/octet-stream;q=0.5", 1, "json", None),
])
def test_a_client_that_asks_for_bytes_gets_them(accept, samples, representation, media):
    request = request_accepting(accept)
    assert negotiate(request, "image/png", samples) == representation
    if media is not None:
        assert binary_media(request, "image/png" if samples == 1 else "application/zip") == media


def test_security_is_declared_as_configured(documents):
    keyed, open_ = documents[True], documents[False]
    assert keyed["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    for path in KEYED:
        op = next(iter(keyed["paths"][path].values()))
        assert op["security"] == [{"HTTPBearer": []}] and "401" in op["responses"], path
    assert "security" not in keyed["paths"]["/healthz"]["get"]
    assert "securitySchemes" not in open_.get("components", {})
    for path, item in open_["paths"].items():
        for op in item.values():
            assert "security" not in op and "401" not in op["responses"] and "429" not in op["responses"], path


def test_a_mask_count_error_names_the_form_field():
    with pytest.raises(ServiceError) as refused:
        check_mix([object(), object()], [object()], None)
    assert refused.value.detail == "style_mask: 1 masks for 2 style images; give one per style"
