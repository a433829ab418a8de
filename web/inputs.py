"""What the UI's file inputs hand a handler, made a path (the image and the video tab)."""
from __future__ import annotations

from typing import Any

FileInput = str | dict[str, Any] | None  # a path, or Gradio's FileData of an upload


def uploaded_path(value: FileInput) -> str | None:
    """The file behind an input: Gradio's file data has it as `path` (a video's data under `video`); always an
    upload by then (`web.files`)."""
    if isinstance(value, dict) and isinstance(value.get("video"), dict):
        value = value["video"]
    if isinstance(value, dict):
        path = value.get("path")
        return path if isinstance(path, str) and path else None
    return value or None
