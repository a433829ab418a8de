"""Property-based: no value of any `/stylize` form field makes the service answer 5xx or hang, and a bad
request never fails the good ones it would have shared a batch with."""
from __future__ import annotations

import io
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from serve.testing import ServerProcess

pytestmark = pytest.mark.slow  # the fast lane (-m "not slow") leaves this file out


def png(color: tuple[int, int, int], size=(24, 18)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


CONTENT, STYLE, MASK = png((200, 40, 40)), png((30, 30, 220)), png((255, 255, 255))


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    # a batch window, so that concurrent requests share one generate call
    srv = ServerProcess.serve(tiny_model_dir, settings={"STYLEVAR_MAX_WAIT_MS": "400", "STYLEVAR_WARMUP": "false"},
                              log_dir=tmp_path_factory.mktemp("logs"))
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**40, 10**40),
                    st.sampled_from([1e39, -1e39, 1e-320, 3.4e38, 0.0, -0.0]))
TEXT = st.text(max_size=12)


def number_text(values) -> str:
    return ",".join(repr(v) for v in values)


FIELDS = st.fixed_dictionaries({}, optional={
    "style_strength": st.one_of(NUMBERS.map(repr), TEXT),
    "seed": st.one_of(st.integers(-5, 2**40).map(str), TEXT),
    "top_k": st.one_of(st.integers(-5, 10**7).map(str), TEXT),
    "top_p": st.one_of(NUMBERS.map(repr), TEXT),
    "num_samples": st.integers(-2, 9).map(str),
    "alphas": st.one_of(st.lists(NUMBERS, max_size=8).map(number_text), st.lists(NUMBERS, max_size=8).map(json.dumps),
                        st.just("[" * 200 + "]" * 200), TEXT),
    "style_weights": st.one_of(st.lists(NUMBERS, min_size=1, max_size=5).map(number_text), TEXT),
    "guidance": st.one_of(NUMBERS.map(repr), TEXT),
    "resize": st.one_of(st.sampled_from(["crop", "pad", "stretch"]), TEXT),
    "upsample": st.one_of(st.sampled_from(["guided", "bicubic"]), TEXT),
    "preserve_color": st.one_of(st.sampled_from(["true", "false"]), TEXT),
    "format": st.one_of(st.sampled_from(["png", "jpeg", "webp"]), TEXT),
})


@settings(max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(fields=FIELDS, n_styles=st.integers(0, 5), n_masks=st.integers(0, 3))
def test_no_form_value_gives_a_server_error(server, fields, n_styles, n_masks):
    files = [("content", ("c.png", CONTENT, "image/png"))]
    files += [("style", (f"s{i}.png", STYLE, "image/png")) for i in range(n_styles)]
    files += [("style_mask", (f"m{i}.png", MASK, "image/png")) for i in range(n_masks)]
    r = httpx.post(server.url + "/stylize", files=files, data=fields, timeout=60,
                   headers={"Accept": "application/json"})
    assert r.status_code < 500, (fields, n_styles, n_masks, r.status_code, r.text[:500])
    if r.status_code >= 400:
        assert r.headers["content-type"] == "application/json" and r.json()["detail"]


def test_a_bad_request_does_not_fail_the_good_ones_batched_with_it(server):
    two = [("content", ("c.png", CONTENT, "image/png")), ("style", ("a.png", STYLE, "image/png")),
           ("style", ("b.png", png((20, 200, 20)), "image/png"))]

    def post(weights: str) -> httpx.Response:
        return httpx.post(server.url + "/stylize", files=two, data={"seed": "3", "style_weights": weights}, timeout=60)

    alone = post("0.5,0.5")
    assert alone.status_code == 200
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, ["1e39,1"] + ["0.5,0.5"] * 7))
    assert answers[0].status_code == 422 and "style_weights" in answers[0].text
    assert all(r.status_code == 200 and r.content == alone.content for r in answers[1:])
    assert '"status": 500' not in server.log_text()
