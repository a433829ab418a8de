"""Gradio web UI for StyleVAR: mounted at `/ui` by `python -m serve`, or `python -m web --api URL`.

Gradio is imported on first use; the UI does not import the service (it gets a `MountConfig`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from web.config import MountConfig

if TYPE_CHECKING:
    import gradio as gr
    from fastapi import FastAPI

    from web.ui import UIConfig

__all__ = ["MountConfig", "build_ui", "mount_ui"]


def mount_ui(app: "FastAPI", config: MountConfig) -> None:
    """Mount the UI at `config.path` of the service's app (see `web.mount.mount_ui`)."""
    from web.mount import mount_ui as _mount_ui
    _mount_ui(app, config)


def build_ui(config: "UIConfig", **kwargs: Any) -> "gr.Blocks":
    """The UI's `gr.Blocks` for the service at `config.api_url` (see `web.ui.build_ui`)."""
    from web.ui import build_ui as _build_ui
    return _build_ui(config, **kwargs)
