"""The StyleVAR inference service: `python -m serve` or `create_app(settings)`.

`serve.http`: the FastAPI app, routes, errors, access, middleware; `serve.engine`: batching and the per-device
runners; beside them `settings`, `testing` (the service in a subprocess) and `healthcheck`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from serve.settings import ServeSettings

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["ServeSettings", "create_app"]


def create_app(settings: ServeSettings | None = None, **kwargs) -> "FastAPI":
    """Build the FastAPI app (see `serve.http.app.create_app`); imported lazily because it loads torch."""
    from serve.http.app import create_app as _create_app
    return _create_app(settings, **kwargs)
