"""The UI's second style, weight, painted mask and guidance: what the handler sends to the service."""
from __future__ import annotations

import io
from pathlib import Path

import gradio as gr
import pytest
from PIL import Image

from tests.conftest import use_weight_cache
from web.baseline import AdaINBaseline
from stylevar.pipelines.request import StylizeRequest
from web.client import Result, ResultImage, form_fields
from web.ui import MAX_SCALES, StyleVARUI, UIConfig, build_ui, editor_background, inverted, painted_mask


class RecordingClient:
    """Stands in for the service: records each stylize_stream call and answers with the content."""

    def __init__(self):
        self.calls: list[tuple] = []

    def model_info(self) -> dict:
        return {"patch_nums": [1, 2, 4], "default_alphas": [0.3, 0.5, 0.7], "config": {}}

    def stylize_stream(self, content, style, options: StylizeRequest, masks=None):
        self.calls.append((content, style, options, masks))
        img = Image.open(content).convert("RGB")
        yield Result("fake", 1, 1.0, [ResultImage(1, img, b"", "image/png")])


@pytest.fixture
def files(tmp_path) -> Path:
    Image.new("RGB", (40, 30), (10, 200, 30)).save(tmp_path / "c.png")
    Image.new("RGB", (20, 20), (200, 10, 10)).save(tmp_path / "s1.png")
    Image.new("RGB", (20, 20), (10, 10, 200)).save(tmp_path / "s2.png")
    layer = Image.new("RGBA", (40, 30), (0, 0, 0, 0))
    layer.paste((255, 45, 117, 255), (0, 0, 10, 30))  # a stroke over the left quarter
    layer.save(tmp_path / "layer.png")
    Image.new("RGBA", (40, 30), (0, 0, 0, 0)).save(tmp_path / "empty.png")
    (tmp_path / "notes.txt").write_text("not an image")
    return tmp_path


@pytest.fixture
def ui(tmp_path, monkeypatch):
    use_weight_cache(monkeypatch, tmp_path / "weights")
    client = RecordingClient()
    return StyleVARUI(UIConfig(api_url="http://127.0.0.1:9"), client=client, baselines=(AdaINBaseline(),)), client


def editor(files: Path, *layers: str) -> dict:
    return {"background": {"path": str(files / "c.png")}, "layers": [{"path": str(files / n)} for n in layers],
            "composite": None}


def run(ui, files, **over):
    args = dict(content=str(files / "c.png"), style=str(files / "s1.png"), style_strength=0.0, seed=3, top_k=900,
                top_p=0.96, num_samples=1, preserve_color=False, resize="stretch", adain=False, adain_alpha=1.0,
                style2=None, style1_weight=0.5, mask=None, guidance=0.0, upsample="guided", custom_alphas=False)
    args.update(over)
    return list(ui.stylize(**args, **{f"alpha_{k + 1}": 0.5 for k in range(MAX_SCALES)}))


def mask_image(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("L")


def test_the_plain_path_sends_what_it_sent_before(ui, files):
    handler, client = ui
    run(handler, files)
    _, styles, options, masks = client.calls[-1]
    assert styles == [str(files / "s1.png")] and masks is None
    assert "style_weights" not in form_fields(options) and "guidance" not in form_fields(options)


def test_second_style_weight_mask_and_guidance(ui, files):
    handler, client = ui
    outs = run(handler, files, style2=str(files / "s2.png"), style1_weight=0.7, mask=editor(files, "layer.png"),
               guidance=1.5)
    assert outs[-1][2].startswith("Done")
    _, styles, options, masks = client.calls[-1]
    assert styles == [str(files / "s1.png"), str(files / "s2.png")]
    form = form_fields(options)
    assert form["style_weights"] == "0.7,0.30000000000000004" and form["guidance"] == "1.5"
    first, second = (mask_image(m) for m in masks)
    assert first.getpixel((2, 5)) == 255 and first.getpixel((30, 5)) == 0  # painted: the first style
    assert second.getpixel((2, 5)) == 0 and second.getpixel((30, 5)) == 255  # the rest: the second


def test_a_mask_without_a_second_style_leaves_the_rest_to_the_content(ui, files):
    handler, client = ui
    run(handler, files, mask=editor(files, "layer.png"))
    _, styles, options, masks = client.calls[-1]
    assert len(styles) == 1 and len(masks) == 1 and "style_weights" not in form_fields(options)


def test_nothing_painted_is_no_mask(files):
    assert painted_mask(editor(files, "empty.png")) is None
    assert painted_mask(editor(files)) is None and painted_mask(None) is None
    assert painted_mask({"path": str(files / "c.png")}) is None  # file data, not the editor's value
    with pytest.raises(gr.Error, match="could not be read"):
        painted_mask(editor(files, "notes.txt"))
    Image.open(files / "layer.png").save(files / "layer.gif")  # a format the API refuses: so does the mask
    with pytest.raises(gr.Error, match=r"could not be read \(PNG, JPEG or WebP\)"):
        painted_mask(editor(files, "layer.gif"))
    assert mask_image(inverted(painted_mask(editor(files, "layer.png")))).getpixel((2, 5)) == 0


def test_the_editor_shows_the_content_and_the_page_has_the_controls(files):
    assert editor_background(str(files / "c.png"))["background"] == str(files / "c.png")
    assert editor_background(None) is None
    config = build_ui(UIConfig(api_url="http://127.0.0.1:9")).get_config_file()
    ids = {c.get("props", {}).get("elem_id") for c in config["components"]}
    assert {"style2-input", "style-weight", "guidance", "mask-editor"} <= ids
