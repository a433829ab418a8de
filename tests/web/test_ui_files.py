"""The UI never hands out server files.

Against the real `python -m serve` (UI mounted at /ui, default access: no API keys) and the standalone
`python -m web`, a Gradio FileData object naming a file on the server (a secret the test writes) is
sent to every UI endpoint that takes files, through each way Gradio offers to call one (the API route
and the browser's queue); the secret must never be copied into Gradio's folders, appear in an answer,
or be downloadable through `/gradio_api/file=`.
"""
from __future__ import annotations

import io
import json
import os
import re
import struct
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image, PngImagePlugin

from serve.testing import ServerProcess
from stylevar.pipelines.pipeline import StylePipeline

pytestmark = pytest.mark.slow  # the fast lane (-m "not slow") leaves this file out

# component types whose values are files (FileData) in Gradio's API
FILE_COMPONENTS = {"image", "file", "files", "gallery", "audio", "video", "model3d", "imageeditor", "uploadbutton",
                   "multimodaltextbox", "annotatedimage", "imageslider", "simpleimage"}
SECRET = f"stylevar-secret-{uuid.uuid4().hex}"


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch):
    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "False")


@pytest.fixture(scope="module")
def secrets_on_disk(tmp_path_factory) -> list[Path]:
    """Server files a request must not reach: a text file and a valid PNG, both holding the secret."""
    d = tmp_path_factory.mktemp("server-private")
    text = d / "hostname"
    text.write_text(SECRET + "\n")
    info = PngImagePlugin.PngInfo()
    info.add_text("secret", SECRET)
    png = d / "private.png"
    Image.new("RGB", (16, 16), (10, 20, 30)).save(png, pnginfo=info)
    return [text, png]


def gradio_env(root: Path) -> dict[str, str]:
    """Gradio's upload folder and example cache in folders the test can search."""
    (root / "uploads").mkdir(parents=True)
    (root / "examples").mkdir(parents=True)
    return {"GRADIO_TEMP_DIR": str(root / "uploads"), "GRADIO_EXAMPLES_CACHE": str(root / "examples"),
            "GRADIO_ANALYTICS_ENABLED": "False"}


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> Iterator[tuple[ServerProcess, Path]]:
    model_dir = tmp_path_factory.mktemp("ui-files-model")
    StylePipeline.random("tiny", name="ui-files").save_pretrained(model_dir)
    root = tmp_path_factory.mktemp("serve-gradio")
    srv = ServerProcess.serve(model_dir, settings={**gradio_env(root), "STYLEVAR_WARMUP": "false"}, extra_args=(),
                              log_dir=tmp_path_factory.mktemp("logs"))
    try:
        yield srv.wait_ready(), root
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def standalone(service, tmp_path_factory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("web-gradio")
    with ServerProcess.web(service[0].url, env=gradio_env(root), log_dir=root) as web:
        yield web.wait_ready(timeout=90, path="/healthz").url, root


@pytest.fixture(params=["serve", "web"])
def ui(request) -> tuple[str, Path]:
    """(base URL of the Gradio app, folder holding its upload folder and example cache)."""
    if request.param == "serve":
        srv, root = request.getfixturevalue("service")
        return srv.url + "/ui", root
    return request.getfixturevalue("standalone")


# ---- Gradio's wire protocol -----------------------------------------------------------------------
def file_endpoints(config: dict) -> list[dict]:
    types = {c["id"]: c["type"] for c in config["components"]}
    return [d for d in config["dependencies"] if d.get("backend_fn", True)
            and any(types.get(i) in FILE_COMPONENTS for i in d["inputs"])]


def inputs_with(config: dict, dep: dict, file_value: dict) -> list:
    """The endpoint's inputs: `file_value` for file components, each other component's default."""
    comps = {c["id"]: c for c in config["components"]}
    return [file_value if comps[i]["type"] in FILE_COMPONENTS else comps[i].get("props", {}).get("value")
            for i in dep["inputs"]]


def sse_messages(text: str) -> list:
    out = []
    for line in text.splitlines():
        if line.startswith("data:"):
            try:
                out.append(json.loads(line[5:].strip()))
            except ValueError:
                out.append(line[5:].strip())
    return out


def call_api_route(http: httpx.Client, base: str, dep: dict, data: list) -> str:
    """POST /gradio_api/call/<api_name>, then the event's stream."""
    r = http.post(f"{base}/gradio_api/call/{dep['api_name']}", json={"data": data})
    if r.status_code != 200:
        return r.text
    event_id = r.json()["event_id"]
    return r.text + http.get(f"{base}/gradio_api/call/{dep['api_name']}/{event_id}", timeout=60).text


def call_queue(http: httpx.Client, base: str, dep: dict, data: list) -> str:
    """What the browser does: POST /gradio_api/queue/join by fn_index, then read the session's stream."""
    session = uuid.uuid4().hex
    body = {"data": data, "fn_index": dep["id"], "session_hash": session, "event_data": None, "trigger_id": None}
    if not dep.get("queue", True):
        return http.post(f"{base}/gradio_api/run/predict", json=body).text
    r = http.post(f"{base}/gradio_api/queue/join", json=body)
    if r.status_code != 200:
        return r.text
    seen = r.text
    with http.stream("GET", f"{base}/gradio_api/queue/data", params={"session_hash": session}, timeout=60) as s:
        for line in s.iter_lines():
            seen += line + "\n"
            if '"process_completed"' in line:
                break
    return seen


def paths_named(answer: str) -> set[str]:
    """Absolute paths an answer names (in file data, URLs or error messages)."""
    return {m for m in re.findall(r"(/[\w.~%+=-]+(?:/[\w.~%+=-]+)+)", answer.replace("\\/", "/"))}


def file_urls(base: str, path: str) -> list[str]:
    """The ways `/gradio_api/file=` could be asked for a path."""
    path = path.split("gradio_api/file=", 1)[-1]
    return [f"{base}/gradio_api/file={path}", f"{base}/gradio_api/file/{path.lstrip('/')}"]


def files_holding(folder: Path, needle: bytes) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and needle in p.read_bytes()]


# ---- the test -------------------------------------------------------------------------------------
def test_filedata_naming_a_server_file_is_neither_copied_nor_served(ui, secrets_on_disk):
    base, gradio_root = ui
    with httpx.Client(timeout=60) as http:
        config = http.get(base + "/config").json()
        endpoints = file_endpoints(config)
        assert any(d["api_name"] == "stylize" for d in endpoints), "the UI's file endpoints were not found"
        answers: list[str] = []
        for secret in secrets_on_disk:
            relative = os.path.relpath(secret, Path.cwd())  # the server runs in the test's working directory
            for path in (str(secret), relative):
                file_data = {"path": path, "orig_name": secret.name, "meta": {"_type": "gradio.FileData"}}
                with_url = {**file_data, "url": f"{base}/gradio_api/file={secret}"}
                for dep in endpoints:
                    for value in (file_data, with_url):
                        data = inputs_with(config, dep, value)
                        if dep.get("api_visibility", "public") == "public":
                            answers.append(call_api_route(http, base, dep, data))
                        answers.append(call_queue(http, base, dep, data))

        assert all(answers), "every call got an answer"
        for answer in answers:
            assert SECRET not in answer
        copies = files_holding(gradio_root, SECRET.encode())
        named = set().union(*map(paths_named, answers)) | {str(c) for c in copies}
        targets = [u for path in sorted(named) for u in file_urls(base, path)]
        targets += [u for secret in secrets_on_disk for u in file_urls(base, str(secret))]
        for url in targets:
            r = http.get(url)
            assert SECRET.encode() not in r.content, f"{url} served a server file"
            if any(str(secret) in url for secret in secrets_on_disk):
                assert r.status_code in (403, 404), (url, r.status_code)
        assert not copies, f"server files were copied into Gradio's folders: {copies}"


def test_uploads_still_work(ui, tmp_path):
    """The same UI, through the same routes, with a file a user uploaded: the stylized image comes back."""
    base, _ = ui
    png = tmp_path / "content.png"
    Image.new("RGB", (48, 32), (200, 120, 40)).save(png)
    with httpx.Client(timeout=120) as http:
        config = http.get(base + "/config").json()
        dep = next(d for d in file_endpoints(config) if d["api_name"] == "stylize")
        uploaded = http.post(base + "/gradio_api/upload", files=[("files", ("content.png", png.read_bytes(),
                                                                              "image/png"))])
        assert uploaded.status_code == 200, uploaded.text
        value = {"path": uploaded.json()[0], "orig_name": "content.png", "meta": {"_type": "gradio.FileData"}}
        answer = call_api_route(http, base, dep, inputs_with(config, dep, value))
    assert "event: complete" in answer, answer[-2000:]
    done = sse_messages(answer.split("event: complete", 1)[1])[0]
    gallery = done[1]
    url = gallery[0]["image"]["url"]
    with httpx.Client(timeout=30) as http:
        img = Image.open(io.BytesIO(http.get(url).content))
    assert img.size == (48, 32)


def test_an_unreadable_upload_gets_the_services_message(service):
    """The UI hands uploads to the service undecoded: a hostile PNG gets the API's own 4xx message."""
    srv, _ = service
    base = srv.url + "/ui"
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    bomb = png.getvalue()[:33] + text_chunk_over_pillows_limit() + png.getvalue()[33:]
    with httpx.Client(timeout=120) as http:
        config = http.get(base + "/config").json()
        dep = next(d for d in file_endpoints(config) if d["api_name"] == "stylize")
        for name, data, message in (("bomb.png", bomb, "Invalid input: content: corrupt or unreadable image"),
                                    ("anim.gif", gif_bytes(), "Not a supported image: content: GIF images are not "
                                                              "accepted (accepted: JPEG, PNG, WebP)")):
            uploaded = http.post(base + "/gradio_api/upload", files=[("files", (name, data, "image/png"))])
            value = {"path": uploaded.json()[0], "orig_name": name, "meta": {"_type": "gradio.FileData"}}
            answer = call_api_route(http, base, dep, inputs_with(config, dep, value))
            errors = [m for m in sse_messages(answer.split("event: error", 1)[-1]) if isinstance(m, dict)]
            assert errors and errors[0]["error"].startswith(message), answer[-1500:]


def text_chunk_over_pillows_limit() -> bytes:
    body = b"k\x00\x00" + zlib.compress(b"a" * (2 << 20))
    return struct.pack(">I", len(body)) + b"zTXt" + body + struct.pack(">I", zlib.crc32(b"zTXt" + body))


def gif_bytes() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buf, "GIF")
    return buf.getvalue()


def test_the_file_policy_allows_the_examples_and_blocks_system_folders(tmp_path):
    from gradio.utils import get_upload_folder

    from web.files import file_policy
    from web.ui import examples_dir

    policy = file_policy([tmp_path / "models"])
    assert policy.allowed == [str(examples_dir().resolve())]
    assert {"/etc", "/proc", str((tmp_path / "models").resolve())} <= set(policy.blocked)
    for needed in (Path(get_upload_folder()).resolve(), examples_dir().resolve()):
        assert not any(needed == Path(b) or Path(b) in needed.parents for b in policy.blocked), needed


def test_an_upload_call_is_capped_and_the_upload_folder_is_cleaned(service):
    """One call to the mounted UI's upload route may not carry more than the API's request limit
    (it took 300 files of 20 MB each), and Gradio deletes uploads older than an hour."""
    from serve.testing import raw_exchange

    srv, _ = service
    answer = raw_exchange(srv.url, "/ui/gradio_api/upload", "Content-Type: multipart/form-data; boundary=b\r\n"
                          f"Content-Length: {21 * 2**20}\r\n", b"--b\r\n")
    assert answer.startswith("HTTP/1.1 413") and "payload_too_large" in answer, answer[:300]
    from web.ui import StyleVARUI, UIConfig

    blocks = StyleVARUI(UIConfig(api_url="http://127.0.0.1:9")).blocks()
    assert blocks.delete_cache == (600, 3600)
