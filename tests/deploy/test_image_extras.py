"""What the container installs covers what it serves (issue 61, point 5): every mounted route and UI tab has its
pyproject extra in the Dockerfile's `pip install`; a route whose extra is missing answers 501 with the install line
(never 500) and its UI tab is hidden. torch is pinned to the CUDA build the Dockerfile states (issue 60, point 9)."""
from __future__ import annotations

import re
import shlex
import sys
import tomllib

import pytest
import torch
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from serve.http.app import create_app
from serve.http.routes.index import UI_PATH
from serve.settings import ServeSettings
from stylevar.loaders import teacher
from stylevar.processing import video
from stylevar.utils.extras import EXTRA_MODULES, install_line, missing_modules
from tests.deploy.test_serve_docker import DOCKERFILE, ROOT, env_of, exec_form, instructions

# what the image's UI shows beyond the API: the UI itself, its Video tab, its default baseline (Magenta)
UI_EXTRAS = {UI_PATH: "web", "Video tab": video.EXTRA, "Magenta baseline": teacher.EXTRA}


def pip_installs() -> list[str]:
    """The arguments of the Dockerfile's `pip install` commands."""
    out = []
    for word, rest in instructions(DOCKERFILE):
        if word == "RUN":
            for command in re.split(r"&&|;", rest):
                argv = shlex.split(command)
                if argv[:2] == ["pip", "install"]:
                    out += argv[2:]
    return out


def image_extras() -> set[str]:
    """The extras of the project (`.[a,b]`) that the image installs."""
    found = [m.group(1) for arg in pip_installs() if (m := re.fullmatch(r"\.\[([\w,\-]+)\]", arg))]
    assert len(found) == 1, f"one `pip install .[extras]` expected, found {found}"
    return set(found[0].split(","))


def api_routes(routes) -> list[APIRoute]:
    """The API routes, those of included routers too (FastAPI keeps an included router whole)."""
    out = []
    for route in routes:
        if isinstance(route, APIRoute):
            out.append(route)
        elif hasattr(route, "original_router"):
            out += api_routes(route.original_router.routes)
    return out


def route_extras(app) -> dict[str, str]:
    """Every API route of ``app`` -> the extra it needs: its module's ``EXTRA``, else the service's own."""
    out = {route.path: getattr(sys.modules[route.endpoint.__module__], "EXTRA", "serve")
           for route in api_routes(app.routes)}
    assert set(app.openapi()["paths"]) <= set(out), "every route in the schema is found"
    return out


@pytest.fixture(scope="module")
def app(tiny_model_dir):
    return create_app(ServeSettings(model_dir=tiny_model_dir, device=["cpu"], ui=False, warmup=False))


def test_the_images_extras_cover_every_mounted_route_and_tab(app):
    extras = image_extras()
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRA_MODULES) <= set(declared) and extras <= set(declared)
    needed = route_extras(app)
    assert needed["/stylize/video"] == "video" and needed["/stylize"] == "serve"
    steps = instructions(DOCKERFILE)
    cmd = exec_form([rest for w, rest in steps if w == "CMD"][-1])
    assert "--no-ui" not in cmd and env_of(steps).get("STYLEVAR_UI", "true") != "false"
    needed.update(UI_EXTRAS)  # the image's CMD mounts the UI
    uncovered = {where: extra for where, extra in needed.items() if extra not in extras}
    assert not uncovered, f"the image does not install what these need: {uncovered}"


def test_torch_is_pinned_to_the_cuda_build_the_image_states():
    pins = dict(arg.split("==", 1) for arg in pip_installs() if "==" in arg)
    assert {"torch", "torchvision"} <= set(pins), "torch and torchvision are pinned in the image"
    base = instructions(DOCKERFILE)[0][1]
    stated = re.search(r'io\.stylevar\.torch-cuda="([\d.]+)"', DOCKERFILE.read_text()).group(1)
    assert re.search(rf"nvidia/cuda:{re.escape(stated)}\.\d+-", base), (base, stated)
    if torch.__version__.split("+")[0] == pins["torch"]:  # the pinned release is the one tested here: its CUDA
        assert torch.version.cuda == stated


def test_the_install_line_names_this_checkout_and_the_service_names_no_path():
    root = ROOT.resolve()
    assert install_line("train") == f"pip install -e '{root}[train]'"  # stylevar installs from its source
    assert install_line("video", paths=False) == "pip install '.[video]' in StyleVAR's source folder"


def test_a_route_whose_extra_is_missing_answers_501_with_the_install_line(app, monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)  # PyAV not installed
    assert missing_modules(video.EXTRA) == ["av"]
    with TestClient(app) as client:
        r = client.post("/stylize/video", files={"video": ("c.mp4", b"\0" * 64, "video/mp4"),
                                                 "style": ("s.png", b"\0" * 64, "image/png")})
    assert r.status_code == 501, r.text
    assert r.json()["error"] == "not_installed" and install_line("video", paths=False) in r.json()["detail"]
    assert "501" in app.openapi()["paths"]["/stylize/video"]["post"]["responses"]


def test_the_video_tab_is_hidden_when_video_is_missing(monkeypatch):
    from web.ui import UIConfig, build_ui

    def video_tab_visible():
        config = build_ui(UIConfig(api_url="http://127.0.0.1:9")).get_config_file()
        [tab] = [c for c in config["components"] if c.get("props", {}).get("id") == "video-tab"]
        return tab["props"]["visible"]

    assert video_tab_visible() is True
    monkeypatch.setitem(sys.modules, "av", None)
    assert video_tab_visible() is False


def test_unknown_extra_is_refused():
    with pytest.raises(ValueError, match="unknown extra 'gpu'"):
        missing_modules("gpu")
