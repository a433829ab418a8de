"""Schema-driven fuzzing of the running service: schemathesis reads /openapi.json and must find no 500.

Run through schemathesis' CLI (its pytest plugin does not load under pytest 9). Every built-in check
is on except `positive_data_acceptance`: the schema cannot say that an uploaded binary must also be a
decodable image, so schema-valid random bytes rightly get 415.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from serve.testing import ServerProcess
from stylevar.pipelines.pipeline import StylePipeline

pytestmark = pytest.mark.slow  # the fast lane (-m "not slow") leaves this file out

KEY = "fuzz-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("tiny-model")
    StylePipeline.random("tiny").save_pretrained(model_dir)
    srv = ServerProcess.serve(model_dir, settings={"STYLEVAR_API_KEYS": KEY, "STYLEVAR_MAX_WAIT_MS": "0"},
                              log_dir=tmp_path_factory.mktemp("logs"))
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


def schemathesis_cli() -> str:
    found = Path(sys.executable).with_name("st")
    return str(found) if found.exists() else (shutil.which("st") or "st")


@pytest.mark.slow  # ~10 s of fuzzing after a ~10 s server start
def test_schemathesis_finds_no_server_error_and_no_schema_violation(server, tmp_path):
    cmd = [schemathesis_cli(), "run", server.url + "/openapi.json",
           "--checks", "all", "--exclude-checks", "positive_data_acceptance",
           "-H", f"Authorization: Bearer {KEY}",
           "--max-examples", "40", "--workers", "1", "--seed", "20261130", "--request-timeout", "60",
           "--generation-database", "none", "--no-color", "--report-dir", str(tmp_path / "report")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "generated" in run.stdout  # it did run test cases
    server_log = server.log_text()
    assert '"status": 500' not in server_log and "unhandled error" not in server_log
