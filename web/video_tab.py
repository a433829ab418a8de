"""The UI's video tab: a short clip and a style image to `POST /stylize/video`, the result played beside the input."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import gradio as gr
from gradio.utils import get_upload_folder

from stylevar.pipelines.options import DECLARED
from stylevar.pipelines.request import StylizeRequest
from stylevar.processing.video import DEFAULT_TEMPORAL, TEMPORAL_HELP, TEMPORAL_MODES

from web.client import ServiceClient, ServiceError
from web.inputs import FileInput, uploaded_path


class VideoTab:
    """The tab's controls and its handler around one `ServiceClient`."""

    def __init__(self, client: ServiceClient, concurrency_limit: int = 2):
        self.client = client
        self.concurrency_limit = concurrency_limit

    def stylize(self, video: Any, style: FileInput, temporal: str = DEFAULT_TEMPORAL, seed: float | None = 0,
                style_strength: float = 0.0) -> tuple[Any, str]:
        """(the result's mp4 path, a status line) for a clip and a style image (uploads: paths or file data)."""
        clip, style_path = uploaded_path(video), uploaded_path(style)
        if not clip or not style_path:
            raise gr.Error("Add a clip and a style image first.", print_exception=False)
        if temporal not in TEMPORAL_MODES:
            raise gr.Error(f"Frames must be one of {', '.join(TEMPORAL_MODES)}.", print_exception=False)
        try:
            options = StylizeRequest.of(seed=seed, style_strength=style_strength)
        except ValueError as e:
            raise gr.Error(f"Invalid input: {e}.", print_exception=False) from None
        try:
            result = self.client.stylize_video(clip, style_path, options, temporal=temporal)
        except ServiceError as e:
            raise gr.Error(e.message, print_exception=False) from None
        folder = Path(tempfile.mkdtemp(prefix="video-", dir=get_upload_folder()))  # cleaned with Gradio's cache
        out = folder / "stylized.mp4"
        out.write_bytes(result.data)
        status = (f"Done: {result.frames} frames at {result.fps:g} fps from `{result.model}` in "
                  f"{result.inference_ms / 1000:.1f} s ({result.temporal}, seed {result.seed}"
                  f"{', audio kept' if result.audio else ''}).")
        return str(out), status

    def blocks(self) -> None:
        """The tab's layout and events (inside a `gr.Blocks`)."""
        strength = DECLARED["style_strength"]
        with gr.Row(equal_height=True):
            video = gr.Video(label="Clip", sources=["upload"], height=260, elem_id="video-input")
            style = gr.Image(label="Style", type="filepath", image_mode=None, height=260,
                             sources=["upload", "clipboard"], elem_id="video-style-input")
        with gr.Row():
            temporal = gr.Radio(list(TEMPORAL_MODES), value=DEFAULT_TEMPORAL, label="Frames", info=TEMPORAL_HELP,
                                elem_id="video-temporal")
            seed = gr.Number(value=0, precision=0, minimum=0, label="Seed", elem_id="video-seed")
            style_strength = gr.Slider(strength.ge, strength.le, value=strength.default, step=strength.step,
                                       label=strength.label, info=strength.help, elem_id="video-style-strength")
        run = gr.Button("Stylize clip", variant="primary", elem_id="video-button")
        status = gr.Markdown("", label="Status", elem_id="video-status")  # the label names the API's output
        result = gr.Video(label="Stylized clip", interactive=False, height=320, elem_id="video-output")
        run.click(self.stylize, inputs=[video, style, temporal, seed, style_strength], outputs=[result, status],
                  api_name="stylize_video", concurrency_limit=self.concurrency_limit,
                  preprocess=False)  # the service decodes the uploads (bounded) and says what is wrong with them
