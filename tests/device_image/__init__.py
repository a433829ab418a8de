"""What a lent GPU machine can import, checked here: :func:`image_env` is a child process's environment in which
only the packages of the machine's image (scripts/device/image.txt) and of the wheels a device run carries
(scripts/device/tokenizer.txt, service.txt) can be imported (this folder's sitecustomize hides the others)."""
from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
LISTS = HERE.parents[1] / "scripts" / "device"


def image_env(carried: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) for a child that imports only what a lent machine holds
    with the wheels of ``scripts/device/<carried>.txt``."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    env["STYLEVAR_DEVICE_LISTS"] = os.pathsep.join(str(LISTS / f"{name}.txt") for name in ("image", carried))
    return env
