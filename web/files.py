"""Which server files the Gradio UI may read: what users upload through it and the example images, nothing else.

Gradio checks the paths named in requests only once its Blocks has "launched", which `gr.mount_gradio_app` does not
mark: `enforce_file_checks` does. `file_policy` adds explicit allowed and blocked folders on top.
"""
from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
from gradio.utils import get_upload_folder

from web.ui import examples_dir

# system folders a UI never needs to read from (those holding the upload folder, e.g. /var on macOS, stay open)
SYSTEM_FOLDERS = ("/etc", "/proc", "/sys", "/dev", "/root", "/boot", "/run", "/var", "/srv", "/home")


@dataclass(frozen=True)
class FilePolicy:
    allowed: list[str]  # folders Gradio may serve besides its upload folder
    blocked: list[str]  # folders it may never read, whatever else says so (takes precedence)


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def file_policy(extra_blocked: Iterable[str | Path] = ()) -> FilePolicy:
    """Allowed: the example images. Blocked: home, the working directory, system folders and `extra_blocked`, but
    no folder that holds the upload folder or the examples."""
    needed = [Path(p).resolve() for p in (get_upload_folder(), examples_dir(), tempfile.gettempdir())]
    candidates = [Path.home(), Path.cwd(), *map(Path, SYSTEM_FOLDERS), *map(Path, extra_blocked)]
    blocked: list[str] = []
    for folder in (c.resolve() for c in candidates):
        if str(folder) not in blocked and not any(_within(n, folder) for n in needed):
            blocked.append(str(folder))
    return FilePolicy(allowed=[str(examples_dir().resolve())], blocked=blocked)


def enforce_file_checks(blocks: gr.Blocks) -> None:
    """Turn on Gradio's own path checks for a Blocks served by `gr.mount_gradio_app` (see the module doc)."""
    if not hasattr(blocks, "has_launched"):
        raise RuntimeError(f"gradio {gr.__version__} has no Blocks.has_launched: the UI cannot make sure requests "
                           "only name uploaded files; use the Gradio version pyproject.toml names")
    blocks.has_launched = True
