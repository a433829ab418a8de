"""The server's connections bounded in time and number (`serve.http.connections`), on a real uvicorn server in a
thread: a client that never reads its answer (a plain one or an event stream) keeps the request's pixels counted
while the answer waits (issue 55, finding 4), then is disconnected after the send timeout and the pixels go back, so
the requests waiting behind it are served (finding 1); connections over a limit get a JSON 503."""
from __future__ import annotations

import contextlib
import io
import logging
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from PIL import Image

from serve.http.app import create_app
from serve.http.connections import ConnectionPolicy, bounded_protocol
from serve.settings import ServeSettings
from serve.testing import free_port

SIDE = 2000  # the unread answer: a 2000 x 2000 PNG stored uncompressed, 12 MB, more than the sockets' buffers


def png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.linear_gradient("L").resize((w, h)).convert("RGB").save(buf, "PNG")
    return buf.getvalue()


CONTENT, STYLE = png(SIDE, SIDE), png(40, 40)
COST = SIDE * SIDE * 2 + 40 * 40  # the content decoded and its result, the style


@contextlib.contextmanager
def running(app, policy: ConnectionPolicy) -> Iterator[str]:
    """`app` served by uvicorn with `policy`, on a free loopback port, in a thread."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False,
                            http=bounded_protocol(policy))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    end = time.monotonic() + 120
    while not server.started and thread.is_alive() and time.monotonic() < end:
        time.sleep(0.05)
    assert server.started, "the server did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(60)


def unread_request(url: str, path: str, files: dict[str, tuple[str, bytes]]) -> socket.socket:
    """Send a multipart POST on a socket with a tiny receive buffer, and never read the answer."""
    body = httpx.Request("POST", url + path, files={k: (n, d, "image/png") for k, (n, d) in files.items()})
    body.read()
    host, port = url.removeprefix("http://").rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((host, int(port)))
    head = "".join(f"{k}: {v}\r\n" for k, v in body.headers.items())
    s.sendall(f"POST {path} HTTP/1.1\r\n{head}\r\n".encode("latin-1") + body.content)
    return s


class Seen(logging.Handler):
    """Records the pixels held when the send timeout disconnects a client."""

    def __init__(self, memory) -> None:
        super().__init__()
        self.memory, self.held_at_timeout = memory, []

    def emit(self, record: logging.LogRecord) -> None:
        if "send timeout" in record.getMessage():
            self.held_at_timeout.append(self.memory.held)


def wait_until(condition, timeout: float = 90.0) -> bool:
    end = time.monotonic() + timeout
    while not condition() and time.monotonic() < end:
        time.sleep(0.05)
    return condition()


@pytest.mark.parametrize("path", ["/stylize", "/stylize/stream"])
def test_an_unread_answer_is_counted_then_cut_and_the_waiting_request_served(micro_model_dir, path):
    settings = ServeSettings(model_dir=micro_model_dir, device=["cpu"], ui=False, warmup=False,
                             png_compress_level=0, max_pixels_in_flight=COST + 1000)  # room for one at a time
    app = create_app(settings)
    memory = app.state.service.memory
    seen = Seen(memory)
    logger = logging.getLogger("serve.http.connections")
    logger.addHandler(seen)
    try:
        with running(app, ConnectionPolicy(send_timeout_s=1.0)) as url:
            unread = unread_request(url, path, {"content": ("c.png", CONTENT), "style": ("s.png", STYLE)})
            assert wait_until(lambda: memory.held >= COST), "the unread request holds its pixels"
            small = httpx.post(url + "/stylize", files={"content": ("c.png", png(64, 48), "image/png"),
                                                        "style": ("s.png", STYLE, "image/png")}, timeout=120)
            assert small.status_code == 200, small.text  # served once the unread client was cut
            assert seen.held_at_timeout and seen.held_at_timeout[0] >= COST, \
                "the answer waiting in the buffer was counted until the client was cut"
            assert wait_until(lambda: memory.held == 0)
            unread.settimeout(30)
            with pytest.raises(OSError):  # reset: the server dropped what the client never read
                while unread.recv(1 << 20):
                    pass
                raise ConnectionResetError("closed")  # an orderly close after the whole answer would be wrong too
            unread.close()
    finally:
        logger.removeHandler(seen)


async def ok(scope, receive, send) -> None:
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


def test_connections_over_the_limits_get_a_json_503():
    with running(ok, ConnectionPolicy(send_timeout_s=5.0, max_connections=3, max_per_client=2)) as url:
        with httpx.Client() as a, httpx.Client() as b:
            assert a.get(url).status_code == 200 and b.get(url).status_code == 200  # two kept-alive connections
            r = httpx.get(url)
            assert r.status_code == 503 and r.json()["error"] == "too_many_connections", r.text
            assert r.headers["retry-after"] == "1" and r.headers["connection"] == "close"
        assert wait_until(lambda: httpx.get(url).status_code == 200, timeout=30), "closed ones leave room"
