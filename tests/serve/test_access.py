"""Access control: API keys compared in constant time, a per-client limit on failed attempts (API and UI
login answer 429 with Retry-After), and the settings that close /docs, /openapi.json and /metrics."""
from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from serve.http.access import FailureLimiter, KeyRing
from serve.http.app import create_app
from serve.settings import ServeSettings
from serve.testing import free_port
from stylevar.pipelines.pipeline import StylePipeline


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("access-model")
    StylePipeline.random("tiny").save_pretrained(d)
    return d


def app_with(model_dir, **over):
    """The app without its lifespan: no model is loaded, authentication and routing answer anyway."""
    settings = dict(model_dir=model_dir, device=["cpu"], ui=False, warmup=False, api_keys=["k-1", "k-2"],
                    auth_max_failures=3, auth_failure_window_s=60)
    return create_app(ServeSettings(**{**settings, **over}))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# ---- units ----------------------------------------------------------------------------------------
def test_key_ring_checks_every_key():
    ring = KeyRing(["alpha", "b\u00e9ta"])
    assert ring.matches("alpha") and ring.matches("b\u00e9ta")
    assert not ring.matches("alph") and not ring.matches("") and not ring.matches("alpha ")
    assert not KeyRing([]) and KeyRing(["x"])


def test_failure_limiter_window_reset_and_bounds():
    now = [0.0]
    lim = FailureLimiter(3, 60.0, max_clients=2, clock=lambda: now[0])
    for _ in range(2):
        lim.failed("a")
    assert lim.retry_after("a") is None
    lim.failed("a")
    assert lim.retry_after("a") == 60
    now[0] = 30.0
    assert lim.retry_after("a") == 30 and lim.retry_after("b") is None
    now[0] = 60.5  # the oldest failure left the window
    assert lim.retry_after("a") is None
    lim.failed("a")
    lim.failed("a")
    lim.succeeded("a")
    assert lim.retry_after("a") is None
    for client in ("x", "y", "z"):  # at most max_clients are tracked
        lim.failed(client)
    assert len(lim._failures) <= 2
    off = FailureLimiter(0, 60.0)
    for _ in range(10):
        off.failed("a")
    assert off.retry_after("a") is None


# ---- the API --------------------------------------------------------------------------------------
def test_wrong_keys_are_limited_per_client(model_dir):
    app = app_with(model_dir)
    attacker, other = TestClient(app, client=("10.0.0.1", 1000)), TestClient(app, client=("10.0.0.2", 1000))
    for _ in range(5):  # no key at all is refused, but is not a guess
        assert attacker.get("/v1/model").status_code == 401
    for _ in range(3):
        r = attacker.get("/v1/model", headers=bearer("guess"))
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    for key in ("guess", "k-2"):  # over the limit even the right key is refused: no answer confirms a guess
        r = attacker.get("/v1/model", headers=bearer(key))
        assert r.status_code == 429, r.text
        assert r.json()["error"] == "too_many_attempts" and 1 <= int(r.headers["retry-after"]) <= 60
    r = attacker.post("/stylize", headers=bearer("k-1"))
    assert r.status_code in (422, 429)  # the form is checked first; never a 200
    assert other.get("/v1/model", headers=bearer("k-1")).status_code == 503  # past auth: the model is not loaded
    assert other.get("/v1/model", headers=bearer("nope")).status_code == 401


def test_the_ui_login_is_limited_too(model_dir):
    app = app_with(model_dir, ui=True, port=free_port())
    attacker, other = TestClient(app, client=("10.0.0.3", 1000)), TestClient(app, client=("10.0.0.4", 1000))
    for _ in range(3):
        assert attacker.post("/ui/login", data={"username": "x", "password": "guess"}).status_code == 400
    r = attacker.post("/ui/login", data={"username": "x", "password": "k-1"})
    assert r.status_code == 429 and r.json()["error"] == "too_many_attempts" and r.headers["retry-after"]
    assert attacker.get("/v1/model", headers=bearer("k-1")).status_code == 429  # one limit for the client
    assert other.post("/ui/login", data={"username": "x", "password": "k-2"}).status_code == 200


def test_the_ui_login_accepts_only_whole_keys(model_dir):
    http = TestClient(app_with(model_dir, ui=True, port=free_port(), auth_max_failures=0))
    for wrong in ("k-", "k-12", "K-1", "k-1 ", "\u00e9"):
        assert http.post("/ui/login", data={"username": "x", "password": wrong}).status_code == 400, wrong
    assert http.post("/ui/login", data={"username": "x", "password": "k-1"}).status_code == 200


# ---- what is exposed without a key ----------------------------------------------------------------
def test_docs_and_metrics_are_open_by_default(model_dir):
    http = TestClient(app_with(model_dir))
    for path in ("/docs", "/openapi.json", "/metrics", "/healthz"):
        assert http.get(path).status_code == 200, path


def test_docs_can_be_turned_off_and_metrics_put_behind_the_key(model_dir):
    http = TestClient(app_with(model_dir, docs=False, metrics_access="key"))
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert http.get(path).status_code == 404, path
    assert http.get("/metrics").status_code == 401
    assert http.get("/metrics", headers=bearer("k-2")).status_code == 200
    assert http.get("/healthz").status_code == 200 and http.get("/readyz").status_code == 503  # probes stay open
    off = TestClient(app_with(model_dir, metrics_access="off"))
    assert off.get("/metrics").status_code == 404


def test_open_bind_without_keys_is_logged(model_dir, caplog):
    with caplog.at_level("WARNING", logger="serve.http.app"):
        app_with(model_dir, api_keys=[], host="0.0.0.0")
    assert "without API keys" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="serve.http.app"):
        app_with(model_dir, api_keys=[], host="127.0.0.1")
    assert "without API keys" not in caplog.text


@pytest.mark.slow
def test_x_forwarded_for_does_not_reset_the_failed_key_limit(tiny_model_dir, tmp_path):
    """A client on the host cannot pose as other addresses: without STYLEVAR_FORWARDED_ALLOW_IPS
    the header is ignored, so rotating it does not escape the limit."""
    import httpx

    from serve.testing import ServerProcess

    srv = ServerProcess.serve(tiny_model_dir, settings={"STYLEVAR_API_KEYS": "right", "STYLEVAR_AUTH_MAX_FAILURES": "3",
                                                        "STYLEVAR_WARMUP": "false"}, log_dir=tmp_path)
    try:
        srv.wait_ready()
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            codes = [c.get("/v1/model", headers={"Authorization": "Bearer wrong", "X-Forwarded-For": f"10.0.0.{i}"})
                     .status_code for i in range(6)]
    finally:
        srv.stop()
    assert codes[:3] == [401] * 3 and codes[3:] == [429] * 3, codes


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/stylize", "/stylize/video"])
def test_a_keyless_upload_is_refused_before_its_body_is_read(tiny_model_dir, tmp_path, path):
    """A request that declares 19 MB and sends 1 KB without a key gets its 401 at once: the key
    is checked before the body is read, on every route that takes uploads."""
    from serve.testing import ServerProcess, raw_exchange

    srv = ServerProcess.serve(tiny_model_dir, settings={"STYLEVAR_API_KEYS": "right", "STYLEVAR_WARMUP": "false"},
                              log_dir=tmp_path)
    try:
        srv.wait_ready()
        answer = raw_exchange(srv.url, path, "Content-Type: multipart/form-data; boundary=b\r\n"
                              "Content-Length: 19000000\r\n", b"x" * 1024, timeout=5)
    finally:
        srv.stop()
    assert answer.startswith("HTTP/1.1 401") and '"unauthorized"' in answer and "www-authenticate: Bearer" in answer


@pytest.mark.slow
def test_a_stalled_or_lying_body_is_closed_within_the_body_timeout(tiny_model_dir, tmp_path):
    """Content-Length 100 kB, 1 kB sent, then nothing: a JSON 408 within STYLEVAR_BODY_TIMEOUT_S."""
    import io
    import time

    import httpx
    from PIL import Image

    from serve.testing import ServerProcess, raw_exchange

    # the batch window (2.5 s) outlasts the body timeout: a request whose body is in is not cut while it waits
    srv = ServerProcess.serve(tiny_model_dir, settings={"STYLEVAR_BODY_TIMEOUT_S": "1", "STYLEVAR_WARMUP": "false",
                                                        "STYLEVAR_MAX_WAIT_MS": "2500"}, log_dir=tmp_path)
    try:
        srv.wait_ready()
        t0 = time.monotonic()
        text = raw_exchange(srv.url, "/stylize", "Content-Type: multipart/form-data; boundary=b\r\n"
                            "Content-Length: 100000\r\n", b"--b\r\n" + b"x" * 1024)
        waited = time.monotonic() - t0
        alive = httpx.get(srv.url + "/healthz", timeout=10).status_code
        img = io.BytesIO()
        Image.new("RGB", (40, 30), (200, 30, 30)).save(img, "PNG")
        upload = {"content": ("c.png", img.getvalue(), "image/png"), "style": ("s.png", img.getvalue(), "image/png")}
        streamed = httpx.post(srv.url + "/stylize/stream", files=upload, timeout=30)
        log = srv.log_text_once(lambda t: '"status": 408' in t or '"status":408' in t)
    finally:
        srv.stop()
    assert text.startswith("HTTP/1.1 408") and '"body_timeout"' in text, text
    # issue 55, finding 8: answered once, logged as 408 (not the form parser's 400), no traceback
    assert text.count("HTTP/1.1 ") == 1, text
    statuses = [json.loads(line).get("status") for line in log.splitlines()
                if line.startswith("{") and json.loads(line).get("path") == "/stylize"]
    assert statuses == [408], statuses
    assert "Traceback" not in log and "Unexpected ASGI message" not in log, log[-3000:]
    assert waited < 5 and alive == 200
    assert streamed.status_code == 200 and "event: result" in streamed.text
