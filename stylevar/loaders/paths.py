"""The project's one cache root, `home()`: where weights placed by hand, pulled model directories and
locks live (`stylevar.loaders.weights`, `stylevar.loaders.hub`, `stylevar.loaders.pull`)."""
from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """The project's cache: `$STYLEVAR_HOME`, default `~/.cache/stylevar` (read on each call)."""
    env = os.environ.get("STYLEVAR_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "stylevar"
