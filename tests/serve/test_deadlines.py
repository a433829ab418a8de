"""Deadlines, disconnects and full batches on a real server whose batch window outlasts the deadline."""
from __future__ import annotations

import asyncio
import io
import json
import time

import httpx
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from serve.testing import ServerProcess
from stylevar.pipelines.pipeline import StylePipeline

# The deadline leaves a full batch of the tiny model seconds to run on a busy two-core CI machine (at 1 s it
# was missed there beside the other test worker); the batch window outlasts it by as much again.
DEADLINE_S = 3.0
WINDOW_S = 6.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("tiny-model")
    StylePipeline.random("tiny").save_pretrained(model_dir)
    # a lone request waits WINDOW_S for company but may only take DEADLINE_S: it times out unless a batch fills up
    settings = {"STYLEVAR_MAX_BATCH_SIZE": "2", "STYLEVAR_MAX_WAIT_MS": str(int(WINDOW_S * 1000)),
                "STYLEVAR_REQUEST_TIMEOUT_S": str(DEADLINE_S)}
    srv = ServerProcess.serve(model_dir, settings=settings, log_dir=tmp_path_factory.mktemp("logs"))
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


def png(w: int = 48, h: int = 32) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (30, 120, 200)).save(buf, "PNG")
    return buf.getvalue()


FILES = {"content": ("c.png", png(), "image/png"), "style": ("s.png", png(32, 32), "image/png")}


def metrics(url: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def get(m: dict, name: str, **labels) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_idle(url: str) -> None:
    end = time.monotonic() + 10
    while time.monotonic() < end and get(metrics(url), "stylevar_queue_depth") != 0:
        time.sleep(0.1)
    time.sleep(WINDOW_S + 0.1)  # let any batch window still open run out


def test_over_the_deadline_answers_504(server):
    r = httpx.post(server.url + "/stylize", files=FILES, timeout=30)
    assert r.status_code == 504, r.text
    assert r.json()["error"] == "deadline_exceeded"


def test_stream_over_the_deadline_ends_with_an_error_event(server):
    with httpx.stream("POST", server.url + "/stylize/stream", files=FILES, timeout=30) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert lines[-2] == "event: error"
    assert json.loads(lines[-1].removeprefix("data: "))["error"] == "deadline_exceeded"


def test_a_full_batch_runs_at_once_and_the_worker_is_not_wedged(server):
    wait_idle(server.url)

    async def pair():
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            return await asyncio.gather(*[c.post("/stylize", files=FILES, data={"seed": str(s)})
                                          for s in (1, 100)])

    before = metrics(server.url)
    responses = asyncio.run(pair())
    assert [r.status_code for r in responses] == [200, 200], [r.text for r in responses]
    after = metrics(server.url)
    assert get(after, "stylevar_batch_size_rows_sum") - get(before, "stylevar_batch_size_rows_sum") == 2
    assert get(after, "stylevar_batch_size_rows_count") - get(before, "stylevar_batch_size_rows_count") == 1


@pytest.mark.slow
def test_a_client_that_disconnects_has_its_job_dropped(server):
    wait_idle(server.url)
    before = metrics(server.url)
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + "/stylize", files=FILES, timeout=httpx.Timeout(30, read=0.3))
    time.sleep(WINDOW_S + 0.5)  # past the batch window: the worker has looked at the job
    after = metrics(server.url)
    assert get(after, "stylevar_jobs_dropped_total", reason="cancelled") - \
        get(before, "stylevar_jobs_dropped_total", reason="cancelled") == 1
    assert get(after, "stylevar_http_requests_total", route="/stylize", method="POST", status="499") - \
        get(before, "stylevar_http_requests_total", route="/stylize", method="POST", status="499") == 1
    assert get(after, "stylevar_batch_size_rows_count") == get(before, "stylevar_batch_size_rows_count"), \
        "the dropped job never reached the model"


@pytest.mark.slow
def test_the_deadline_counts_from_arrival_the_upload_included(tiny_model_dir, tmp_path):
    """A body that takes longer than STYLEVAR_REQUEST_TIMEOUT_S to arrive gets 504, not a fresh
    deadline after it is decoded."""
    import io

    from PIL import Image

    from serve.testing import ServerProcess, raw_exchange

    img = io.BytesIO()
    Image.new("RGB", (20, 20), (9, 9, 9)).save(img, "PNG")
    parts = b"".join(b"--b\r\nContent-Disposition: form-data; name=\"%s\"; filename=\"%s.png\"\r\n"
                     b"Content-Type: image/png\r\n\r\n" % (n, n) + img.getvalue() + b"\r\n" for n in (b"content", b"style"))
    body = parts + b"--b--\r\n"
    srv = ServerProcess.serve(tiny_model_dir, settings={"STYLEVAR_REQUEST_TIMEOUT_S": "1", "STYLEVAR_WARMUP": "false"},
                              log_dir=tmp_path)
    try:
        srv.wait_ready()
        half = len(body) // 2  # the halves 1.5 s apart: slower than the deadline, quicker than the body timeout
        text = raw_exchange(srv.url, "/stylize", f"Connection: close\r\nContent-Type: multipart/form-data; boundary=b"
                            f"\r\nContent-Length: {len(body)}\r\n", body[:half], body[half:], pause_s=1.5, timeout=20)
    finally:
        srv.stop()
    assert text.startswith("HTTP/1.1 504") and "deadline_exceeded" in text, text[:400]
