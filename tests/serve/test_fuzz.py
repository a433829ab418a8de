"""Schema-driven testing of the running service: Schemathesis reads /openapi.json, sends every operation its
examples and the coverage phase's cases (each constraint's boundaries, valid and invalid), and runs every check.

Run through schemathesis' CLI (its pytest plugin does not load under pytest 9). Its hooks
(tests/serve/schemathesis_hooks.py) put real images and a real clip into the file fields and make a valid
request's counts agree across fields; with them a schema-valid request must be accepted (`positive_data_acceptance`)
and an invalid one refused. The one kind of failure they drop, and why, is in docs/serving.md ("Generated clients").
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from serve.testing import ServerProcess
from tests.processing.test_video_io import make_clip

pytestmark = pytest.mark.slow  # the fast lane (-m "not slow") leaves this file out

KEY = "fuzz-key"
HOOKS = Path(__file__).with_name("schemathesis_hooks.py")


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    # the `ignored_auth` check sends wrong keys on purpose: no lockout of the client (tests/serve/test_access.py)
    settings = {"STYLEVAR_API_KEYS": KEY, "STYLEVAR_MAX_WAIT_MS": "0", "STYLEVAR_AUTH_MAX_FAILURES": "0"}
    with ServerProcess.serve(tiny_model_dir, settings=settings, log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv.wait_ready()


@pytest.fixture(scope="module")
def real_files(tmp_path_factory) -> Path:
    """The files the hooks send (`schemathesis_hooks.FILES`): a content image, a style, a mask, a 1-frame clip."""
    folder = tmp_path_factory.mktemp("fuzz-files")
    ramp = np.linspace(0, 255, 48, dtype=np.uint8)
    Image.fromarray(np.stack([np.tile(ramp, (32, 1))] * 3, -1)).save(folder / "content.png")
    Image.new("RGB", (40, 40), (20, 90, 200)).save(folder / "style.png")
    Image.new("L", (24, 16), 200).save(folder / "mask.png")
    make_clip(folder / "video.mp4", frames=1, size=(32, 24))
    return folder


def schemathesis_cli() -> str:
    found = Path(sys.executable).with_name("st")
    return str(found) if found.exists() else (shutil.which("st") or "st")


@pytest.mark.timeout(400)
def test_every_operation_meets_its_schema_with_real_files(server, real_files, tmp_path):
    # ~500 cases, 50-140 s on 2 cores as loaded: every valid upload is a model run
    cmd = [schemathesis_cli(), "run", server.url + "/openapi.json", "--checks", "all",
           "--phases", "examples,coverage", "-H", f"Authorization: Bearer {KEY}",
           "--workers", "1", "--seed", "20261130", "--request-timeout", "120",
           "--max-response-time", "300",  # its default (10 s) would time a loaded machine, not the service
           "--generation-database", "none", "--no-color", "--report-dir", str(tmp_path / "report")]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS), "STYLEVAR_FUZZ_FILES": str(real_files)}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=360, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "passed" in run.stdout and "Examples" in run.stdout and "Coverage" in run.stdout
    server_log = server.log_text()
    assert '"status": 500' not in server_log and "unhandled error" not in server_log
    assert '"path": "/stylize/video", "route": "/stylize/video", "status": 200' in server_log  # the clip went through
