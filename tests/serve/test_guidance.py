"""What the service tells someone new to it: a misspelt form field is refused with the nearest one (and the document
says the forms are closed), a picture too small to carry much is answered with the command line's warning, and
`python -m serve` says where the UI, the API and the docs are, or why it cannot start (a model it cannot load, a port
in use), in one plain line."""
from __future__ import annotations

import io
import os
import re
import socket
import subprocess
import sys
import threading

import httpx
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from serve.__main__ import ready_line
from serve.http.app import create_app
from serve.settings import ServeSettings
from tests.serve.test_openapi import form

UPLOADS = {"/stylize": "content", "/stylize/stream": "content", "/stylize/video": "video"}


def png(size: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 60, 30)).save(buf, format="PNG")
    return buf.getvalue()


def app_with(model_dir, **over):
    return create_app(ServeSettings(**{"model_dir": model_dir, "device": ["cpu"], "ui": False, "warmup": False,
                                       **over}))


@pytest.mark.parametrize("path", list(UPLOADS))
def test_a_misspelt_field_is_refused_with_the_nearest_name(tiny_model_dir, path):
    http = TestClient(app_with(tiny_model_dir))  # no lifespan: no model, the form is checked first
    files = {UPLOADS[path]: ("c.png", png((32, 32)), "image/png"), "style": ("s.png", png((32, 32)), "image/png")}
    r = http.post(path, files=files, data={"style_strenght": "0.9", "seed": "1"})
    assert r.status_code == 422, r.text
    assert r.json() == {"error": "validation_error",
                        "detail": "unknown field 'style_strenght'; did you mean 'style_strength'?"}
    assert http.post(path, files=files, data={"seed": "1"}).status_code == 503  # known fields pass: not loaded yet


def test_unknown_fields_are_ignored_when_the_setting_allows_them(tiny_model_dir):
    files = {"content": ("c.png", png((32, 32)), "image/png"), "style": ("s.png", png((32, 32)), "image/png")}
    lenient = app_with(tiny_model_dir, allow_unknown_fields=True)
    r = TestClient(lenient).post("/stylize", files=files, data={"style_strenght": "0.9"})
    assert r.status_code == 503 and r.json()["error"] == "not_ready"
    assert "additionalProperties" not in form(lenient.openapi(), "/stylize")
    strict = app_with(tiny_model_dir).openapi()
    assert all(form(strict, path)["additionalProperties"] is False for path in UPLOADS)


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    """A loaded service (its lifespan run), and the event its `on_ready` sets."""
    app, ready = app_with(tiny_model_dir, port=8123), threading.Event()
    app.state.service.on_ready = ready.set
    with TestClient(app) as http:
        yield app, http, ready


def test_a_tiny_picture_is_answered_with_the_command_lines_warning(loaded):
    _, http, _ = loaded
    files = {"content": ("c.png", png((1, 1)), "image/png"), "style": ("s.png", png((40, 12)), "image/png")}
    r = http.post("/stylize", files=files, data={"seed": "3"})
    assert r.status_code == 200, r.text
    assert r.headers["X-StyleVAR-Warning"] == (
        "the content image is only 1x1 pixels; it is scaled up to the model's size and carries little content "
        "(use an image of at least 16x16); the style image is only 40x12 pixels; it is scaled up to the model's "
        "size and carries little style (use an image of at least 16x16)")
    files["content"] = ("c.png", png((32, 32)), "image/png")
    files["style"] = ("s.png", png((16, 16)), "image/png")
    assert "X-StyleVAR-Warning" not in http.post("/stylize", files=files, data={"seed": "3"}).headers


def test_the_ready_line_says_where_everything_is(loaded):
    app, _, ready = loaded
    assert ready.wait(60)
    settings = app.state.service.settings
    assert ready_line(app, settings) == ("StyleVAR ready (tiny-test, fp32): API http://127.0.0.1:8123/stylize  "
                                         "docs http://127.0.0.1:8123/docs")
    wide = settings.model_copy(update={"host": "0.0.0.0"})
    assert "API http://127.0.0.1:8123/stylize" in ready_line(app, wide)


@pytest.mark.slow
def test_a_hub_model_that_cannot_be_fetched_is_one_plain_error(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path)}  # a missing folder: test_units
    done = subprocess.run([sys.executable, "-m", "serve", "--model", "hf:nobody/nothing", "--no-ui", "--port", "0"],
                          cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    said = "\n".join(line for line in done.stderr.splitlines() if not line.startswith('{"ts"'))  # the info logs stay
    assert said.startswith("cannot start: hf:nobody/nothing") and "stylevar pull nobody/nothing" in said, said
    assert "Traceback" not in done.stderr and '"level": "ERROR"' not in done.stderr


@pytest.mark.slow
def test_a_port_in_use_is_one_plain_error_before_the_model_loads(tiny_model_dir, tmp_path):
    with socket.socket() as taken:  # another service on the port (bound and listening)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "serve", "--model", str(tiny_model_dir), "--no-ui", "--port",
                               str(port)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""  # no "StyleVAR ready" line
    assert done.stderr == (f"cannot start: 127.0.0.1:{port} is already in use (another server, or an earlier run "
                           "still going?): stop that process or choose a free port with --port or STYLEVAR_PORT\n")


def test_an_address_that_is_not_here_says_so():
    from stylevar.utils.listen import address_error, listening_socket

    with pytest.raises(OSError) as e:
        listening_socket("192.0.2.1", 0)  # TEST-NET-1: never this machine's
    assert address_error("192.0.2.1", 0, e.value).startswith("--host 192.0.2.1 is not an address of this machine")
    with listening_socket("127.0.0.1", 0) as sock:  # bound, port chosen by the system
        assert sock.getsockname()[0] == "127.0.0.1" and sock.getsockname()[1] > 0


@pytest.mark.slow
def test_port_0_takes_a_free_port_names_it_and_mounts_the_ui_there(tiny_model_dir, tmp_path):
    env = {**os.environ, "STYLEVAR_DEVICE": "cpu", "STYLEVAR_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "serve", "--model", str(tiny_model_dir), "--port", "0"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()  # the ready line is the first thing on stdout
        match = re.match(r"StyleVAR ready \(tiny-test, fp32\): UI (http://127\.0\.0\.1:(\d+))/ui  API ", line)
        assert match and int(match.group(2)) > 0, line
        assert httpx.get(match.group(1) + "/ui/", timeout=30).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=60)


RACE = """
import socket, sys
import serve.__main__ as m
taken = socket.socket()
taken.bind(("127.0.0.1", 0))
taken.listen()  # another process takes the port while the model loads
port = taken.getsockname()[1]

class Held:  # the address as held until uvicorn binds it
    def getsockname(self):
        return ("127.0.0.1", port)
    def close(self):
        pass

m.listening_socket = lambda host, port: Held()
sys.exit(m.main(["--model", sys.argv[1], "--no-ui", "--port", str(port)]))
"""


@pytest.mark.slow
def test_a_port_taken_while_the_model_loads_is_a_plain_line_and_no_ready_line(tiny_model_dir, tmp_path):
    done = subprocess.run([sys.executable, "-c", RACE, str(tiny_model_dir)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 3 and "StyleVAR ready" not in done.stdout
    assert done.stderr.strip().splitlines()[-1].startswith("cannot start: the service did not start on 127.0.0.1:")
