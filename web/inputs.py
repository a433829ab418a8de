"""What the UI's file inputs hand a handler, made a path: shared by the image tab (`web.ui`) and the video tab
(`web.video_tab`)."""
from __future__ import annotations

from typing import Any

FileInput = str | dict[str, Any] | None  # a path, or Gradio's FileData of an upload


def uploaded_path(value: FileInput) -> str | None:
    """The file behind an image input: Gradio's file data has it as `path` (always an upload by then:
    Gradio refuses file data naming any other server file before the handler runs, see web.files)."""
    if isinstance(value, dict):
        path = value.get("path")
        return path if isinstance(path, str) and path else None
    return value or None
