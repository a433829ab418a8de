"""The Gradio Blocks UI: inputs, examples, settings, a live coarse-to-fine preview, results, AdaIN, model panel.

Every generation goes through the service's HTTP API (`POST /stylize/stream`) with `web.client`; the UI
holds no model of its own. Only the optional AdaIN baseline runs in the UI's process.
"""
from __future__ import annotations

import io
import random
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import gradio as gr
from PIL import Image, ImageChops, ImageOps

from stylevar.generation import DEFAULT_GENERATION
from stylevar.images import ACCEPTED_FORMATS
from stylevar.pipeline import DEMO_LABEL
from stylevar.postprocess import DEFAULT_UPSAMPLE, MAX_SEED, UPSAMPLE_MODES

from .baseline import AdaINBaseline, BaselineStatus
from .client import Preview, Result, ServiceClient, ServiceError, StylizeOptions

MAX_SCALES = 16  # alpha sliders kept ready; those beyond the model's scale count stay hidden
RESIZE_MODES = ("stretch", "crop", "pad")
MAX_GUIDANCE = 4.0  # the slider's end (the service takes up to 10; past 4 pictures fall apart)
MAX_MASK_PIXELS = 4096 * 4096  # a painted layer larger than this is refused before it is decoded
CSS = """
#preview img { image-rendering: pixelated; width: 100%; height: 100%; object-fit: contain; }
#model-panel { font-size: 0.95em; }
"""


@dataclass(frozen=True)
class UIConfig:
    """Where the service is and how the UI talks to it."""

    api_url: str  # base URL of the service, e.g. http://127.0.0.1:8000
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 120.0  # longest wait for the next stream event
    concurrency_limit: int = 16  # UI generations in flight at once (the service batches them)
    title: str = "StyleVAR"
    # Gradio keeps every upload in its folder: files older than `upload_max_age_s` are deleted every
    # `upload_clean_every_s` (gr.Blocks' delete_cache)
    upload_max_age_s: int = 3600
    upload_clean_every_s: int = 600


def example_pairs() -> list[list[str]]:
    """The project's own example images, `content_*.png` paired in order with `style_*.png`."""
    folder = examples_dir()
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".png"))
    contents = [str(folder / n) for n in names if n.startswith("content_")]
    styles = [str(folder / n) for n in names if n.startswith("style_")]
    return [[c, s] for c, s in zip(contents, styles)]


FileInput = str | dict[str, Any] | None  # a path, or Gradio's FileData of an upload


def uploaded_path(value: FileInput) -> str | None:
    """The file behind an image input: Gradio's file data has it as `path` (always an upload by then:
    Gradio refuses file data naming any other server file before the handler runs, see web.files)."""
    if isinstance(value, dict):
        path = value.get("path")
        return path if isinstance(path, str) and path else None
    return value or None


def painted_mask(value: Any) -> bytes | None:
    """The strokes painted in the mask editor as a PNG mask (white where painted, black elsewhere); None when
    nothing is painted. ``value`` is the editor's data (background, layers, composite): the strokes are the
    layers' alpha, whatever their colour."""
    if not isinstance(value, dict) or not isinstance(value.get("layers"), list):
        return None
    alpha: Image.Image | None = None
    for layer in value["layers"]:
        path = uploaded_path(layer)
        if not path:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                with Image.open(path, formats=ACCEPTED_FORMATS) as im:  # what the API accepts, nothing else
                    if im.width * im.height > MAX_MASK_PIXELS:
                        raise gr.Error("The painted mask is too large.", print_exception=False)
                    a = im.convert("RGBA").getchannel("A")
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise gr.Error("The painted mask is too large.", print_exception=False) from None
        except (OSError, ValueError, SyntaxError):
            raise gr.Error("The painted mask could not be read (PNG, JPEG or WebP); clear it and paint again.",
                           print_exception=False) from None
        alpha = a if alpha is None else ImageChops.lighter(alpha, a.resize(alpha.size))
    if alpha is None or alpha.getextrema()[1] == 0:
        return None
    buf = io.BytesIO()
    alpha.point(lambda v: 255 if v > 0 else 0).save(buf, format="PNG")
    return buf.getvalue()


def inverted(mask_png: bytes) -> bytes:
    """The complement of a PNG mask: where the first style is not painted, the second applies."""
    with Image.open(io.BytesIO(mask_png)) as im:
        out = ImageOps.invert(im.convert("L"))
    buf = io.BytesIO()
    out.save(buf, format="PNG")
    return buf.getvalue()


def editor_background(content: FileInput) -> dict[str, Any] | None:
    """The mask editor shows the content to paint on (no strokes yet); empty without a content image."""
    path = uploaded_path(content)
    return {"background": path, "layers": [], "composite": path} if path else None


def examples_dir() -> Path:
    return Path(str(resources.files("stylevar") / "assets" / "examples"))


def model_markdown(info: dict[str, Any]) -> str:
    """The model panel's text from `GET /v1/model`."""
    patch_nums = info.get("patch_nums", [])
    scales = ", ".join(f"{p}×{p}" for p in patch_nums)
    lines = []
    if info.get("demo"):
        lines.append(f"**Model: {DEMO_LABEL}.** It shows how the system works; "
                     "expect rough pictures, not the paper's quality.")
    else:
        lines.append(f"**Model: `{info.get('name', '?')}`**")
    lines.append(f"{info.get('image_size', '?')} px · {len(patch_nums)} scales ({scales}) · "
                 f"{', '.join(info.get('devices', []))} · {info.get('dtype', '?')} · "
                 f"stylevar {info.get('version', '?')}")
    return "\n\n".join(lines)


def tile(images: list[Image.Image]) -> Image.Image:
    """Images side by side (one preview per sample)."""
    if len(images) == 1:
        return images[0]
    h = max(im.height for im in images)
    strip = Image.new("RGB", (sum(im.width for im in images) + 4 * (len(images) - 1), h), (255, 255, 255))
    x = 0
    for im in images:
        strip.paste(im.convert("RGB"), (x, 0))
        x += im.width + 4
    return strip


class StyleVARUI:
    """Event handlers around one `ServiceClient`; `blocks()` lays out the page."""

    def __init__(self, config: UIConfig, *, client: ServiceClient | None = None,
                 baseline: AdaINBaseline | None = None):
        self.config = config
        self.client = client or ServiceClient(config.api_url, api_key=config.api_key, timeout_s=config.timeout_s)
        self.baseline = baseline or AdaINBaseline()
        self.baseline_status: BaselineStatus = self.baseline.status()

    # ---- handlers ---------------------------------------------------------------------------------
    def on_load(self) -> list[Any]:
        """Model panel, the model's recommended top-k/top-p and the per-scale alpha sliders."""
        try:
            info = self.client.model_info()
        except ServiceError as e:
            return [f"**Model: unknown.** {e.message}", gr.update(), gr.update()] + [gr.update(visible=False)] * MAX_SCALES
        generation = info.get("config", {}).get("generation", {})
        top_k = gr.update(value=generation.get("top_k", DEFAULT_GENERATION.top_k))
        top_p = gr.update(value=generation.get("top_p", DEFAULT_GENERATION.top_p))
        patch_nums, defaults = info.get("patch_nums", []), info.get("default_alphas", [])
        sliders = []
        for k in range(MAX_SCALES):
            if k < len(patch_nums):
                value = defaults[k] if k < len(defaults) else 0.5
                label = f"α, scale {k + 1} ({patch_nums[k]}×{patch_nums[k]})"
                sliders.append(gr.update(visible=True, value=value, label=label))
            else:
                sliders.append(gr.update(visible=False))
        return [model_markdown(info), top_k, top_p] + sliders

    def stylize(self, content: FileInput, style: FileInput, style_strength: float, seed: float | None,
                top_k: float, top_p: float, num_samples: float, preserve_color: bool, resize: str,
                adain: bool, adain_alpha: float, style2: FileInput = None, style1_weight: float = 0.5,
                mask: Any = None, guidance: float = 0.0, upsample: str = DEFAULT_UPSAMPLE, custom_alphas: bool = False,
                *alphas: float,
                ) -> Iterator[tuple[Any, Any, Any, Any]]:
        """Yields (preview, results gallery, status, AdaIN image) as the picture forms coarse to fine.

        `content`, `style` and `style2` are uploaded files: a path, or Gradio's file data (the event does not
        preprocess its inputs). With `style2` the two styles are blended, the first at `style1_weight`;
        strokes painted in the `mask` editor confine the first style to them (and the second, if any, to the
        rest). `guidance` > 0 pushes away from the picture without the style."""
        content, style, style2 = uploaded_path(content), uploaded_path(style), uploaded_path(style2)
        if not content or not style:
            raise gr.Error("Add a content image and a style image first (upload, paste, webcam, or pick an example).",
                           print_exception=False)
        if resize not in RESIZE_MODES:
            raise gr.Error(f"Resize mode must be one of {', '.join(RESIZE_MODES)}.", print_exception=False)
        if upsample not in UPSAMPLE_MODES:
            raise gr.Error(f"Upsampling must be one of {', '.join(UPSAMPLE_MODES)}.", print_exception=False)
        w = min(max(float(style1_weight), 0.0), 1.0)
        painted = painted_mask(mask)
        styles = [style, style2] if style2 else [style]
        masks = None if painted is None else ([painted, inverted(painted)] if style2 else [painted])
        try:
            options = StylizeOptions(
                style_strength=float(style_strength), seed=None if seed is None else int(seed), top_k=int(top_k),
                top_p=float(top_p), num_samples=int(num_samples), resize=resize,  # type: ignore[arg-type]
                preserve_color=bool(preserve_color),
                alphas=self._alphas(alphas) if custom_alphas else None,
                style_weights=(w, 1.0 - w) if style2 else None, guidance=float(guidance or 0.0), upsample=upsample,
            )
        except ServiceError as e:
            raise gr.Error(e.message, print_exception=False) from None
        yield None, None, "Sending the images to the service…", None
        result: Result | None = None
        try:
            for event in self.client.stylize_stream(content, styles, options, masks):
                if isinstance(event, Preview):
                    status = (f"Generating: scale {event.scale + 1} of {event.num_scales} "
                              f"({event.patch_num}×{event.patch_num} tokens)…")
                    yield tile(event.images), gr.skip(), status, gr.skip()
                else:
                    result = event
        except ServiceError as e:
            yield gr.skip(), gr.skip(), f"**Error:** {e.message}", gr.skip()
            raise gr.Error(e.message, print_exception=False) from None
        assert result is not None  # stylize_stream ends with a Result or raises
        gallery = [(r.image, f"seed {r.seed}") for r in result.images]
        status = (f"Done: {len(result.images)} image(s) from `{result.model}` in {result.inference_ms:.0f} ms "
                  f"(seed {result.seed}).")
        yield tile([r.image for r in result.images]), gallery, status, gr.skip()
        if adain and self.baseline_status.available:
            yield gr.skip(), gr.skip(), status + " Running AdaIN…", gr.skip()
            try:
                adain_img = self.baseline.stylize(content, style, alpha=adain_alpha)
            except Exception as e:  # noqa: BLE001 - the StyleVAR result stands; say why AdaIN did not
                yield gr.skip(), gr.skip(), status + f" AdaIN failed: {e}", None
                return
            yield gr.skip(), gr.skip(), status, adain_img

    def _alphas(self, alphas: tuple[float, ...]) -> tuple[float, ...]:
        n = len(self.client.model_info().get("patch_nums", []))
        if not 0 < n <= len(alphas):
            raise ServiceError(422, "validation_error", f"the model has {n} scales; the UI has {len(alphas)} alphas")
        return tuple(float(a) for a in alphas[:n])

    # ---- layout -----------------------------------------------------------------------------------
    def blocks(self) -> gr.Blocks:
        adain_ok = self.baseline_status.available
        cleaning = (self.config.upload_clean_every_s, self.config.upload_max_age_s)
        with gr.Blocks(title=self.config.title, analytics_enabled=False, delete_cache=cleaning) as demo:
            gr.Markdown(f"# {self.config.title}\nRe-draw a **content** picture in the look of a **style** picture. "
                        "The model draws coarse to fine, one token map per scale; watch it form in the preview.")
            model_panel = gr.Markdown("Loading model information…", elem_id="model-panel")
            with gr.Row():
                with gr.Column(scale=3):
                    with gr.Row(equal_height=True):
                        content = gr.Image(label="Content", type="filepath", image_mode=None, height=260,
                                           sources=["upload", "clipboard", "webcam"], elem_id="content-input")
                        style = gr.Image(label="Style", type="filepath", image_mode=None, height=260,
                                         sources=["upload", "clipboard", "webcam"], elem_id="style-input")
                    with gr.Row(equal_height=True):
                        strength = gr.Slider(-1.0, 1.0, value=0.0, step=0.05, label="Style strength",
                                             info="-1 keeps more of the content, 1 takes more of the style", scale=3)
                        seed = gr.Number(value=0, precision=0, minimum=0, maximum=MAX_SEED, label="Seed", scale=1)
                        dice = gr.Button("Randomise seed", scale=0, min_width=110, elem_id="randomise-seed")
                    with gr.Accordion("Advanced", open=False):
                        with gr.Row():
                            top_k = gr.Number(value=DEFAULT_GENERATION.top_k, precision=0, minimum=0, label="Top-k",
                                              info="0 switches it off; starts at the model's recommended value")
                            top_p = gr.Slider(0.0, 1.0, value=DEFAULT_GENERATION.top_p, step=0.01, label="Top-p",
                                              info="0 or 1 switches it off")
                            samples = gr.Slider(1, 4, value=1, step=1, label="Number of samples",
                                                info="sample i uses seed + i")
                        with gr.Row():
                            preserve = gr.Checkbox(value=False, label="Preserve colour",
                                                   info="keep the content's colours, take the style's texture")
                            resize = gr.Radio(list(RESIZE_MODES), value="stretch", label="Resize mode",
                                              info="how the content fits the model's square; "
                                                   "crop returns the centre square")
                            upsample = gr.Radio(list(UPSAMPLE_MODES), value=DEFAULT_UPSAMPLE, label="Upsampling",
                                                info="to your image's size: guided adds the content's fine detail, "
                                                     "bicubic only resizes the model's drawing",
                                                elem_id="upsample")
                        with gr.Row(equal_height=True):
                            style2 = gr.Image(label="Second style (optional)", type="filepath", image_mode=None,
                                              height=200, sources=["upload", "clipboard"], elem_id="style2-input")
                            with gr.Column():
                                weight = gr.Slider(0.0, 1.0, value=0.5, step=0.05, label="Weight of the first style",
                                                   info="with a second style: 1 = the first only, 0 = the second "
                                                        "only", elem_id="style-weight")
                                guidance = gr.Slider(0.0, MAX_GUIDANCE, value=0.0, step=0.25, label="Style guidance",
                                                     info="pushes away from the picture without the style: more "
                                                          "style, less content; 0 = off", elem_id="guidance")
                        mask = gr.ImageEditor(label="Mask: paint where the first style applies (the second style, "
                                                    "or the content, keeps the rest); nothing painted = everywhere",
                                              type="filepath", sources=(), transforms=(), layers=False, height=280,
                                              brush=gr.Brush(colors=["#ff2d75"], color_mode="fixed", default_size=10),
                                              elem_id="mask-editor")
                        custom = gr.Checkbox(value=False, label="Custom per-scale alphas",
                                             info="weight of the style (1) against the content (0) guidance at "
                                                  "each scale, coarse to fine; off: the model's own")
                        with gr.Row():
                            alpha_sliders = [gr.Slider(0.0, 1.0, value=0.5, step=0.05, label=f"α, scale {k + 1}",
                                                       visible=False, min_width=120) for k in range(MAX_SCALES)]
                    with gr.Row():
                        run = gr.Button("Stylize", variant="primary", elem_id="stylize-button", scale=3)
                        stop = gr.Button("Stop", variant="stop", scale=1)
                pairs = example_pairs()
                if pairs:
                    with gr.Column(scale=2):
                        gr.Examples(pairs, inputs=[content, style], label="Examples (content, style)",
                                    examples_per_page=6, cache_examples=False)
            status = gr.Markdown("", elem_id="status")
            with gr.Row(equal_height=True):
                preview = gr.Image(label="Coarse-to-fine preview", interactive=False, format="png", height=320,
                                   elem_id="preview", buttons=["fullscreen"])
                results = gr.Gallery(label="Results", format="png", columns=2, height=320, elem_id="results",
                                     object_fit="contain",
                                     buttons=["download", "download_all", "fullscreen"], interactive=False)
                with gr.Column():
                    adain_img = gr.Image(label="AdaIN (baseline)", interactive=False, format="png", height=220,
                                         elem_id="adain-output")
                    adain_on = gr.Checkbox(value=adain_ok, interactive=adain_ok, label="Run AdaIN beside StyleVAR")
                    adain_alpha = gr.Slider(0.0, 1.0, value=1.0, step=0.05, label="AdaIN alpha",
                                            interactive=adain_ok)
                    gr.Markdown(("" if adain_ok else "**AdaIN disabled:** ") + self.baseline_status.reason,
                                elem_id="adain-status")

            demo.load(self.on_load, outputs=[model_panel, top_k, top_p, *alpha_sliders], api_visibility="private")
            dice.click(lambda: random.randint(0, MAX_SEED), outputs=seed, api_visibility="private")
            # the mask is painted on the content: a new content clears the strokes (no decoding here)
            content.change(editor_background, inputs=content, outputs=mask, api_visibility="private",
                           preprocess=False)
            event = run.click(
                self.stylize,
                inputs=[content, style, strength, seed, top_k, top_p, samples, preserve, resize, adain_on,
                        adain_alpha, style2, weight, mask, guidance, upsample, custom, *alpha_sliders],
                outputs=[preview, results, status, adain_img],
                api_name="stylize", concurrency_limit=self.config.concurrency_limit,
                # the handler gets the uploads' file data (after Gradio's path checks) and never decodes them:
                # Gradio's preprocessing would open each image with Pillow here and report a bad one as an
                # internal error; the service decodes (bounded) and answers with its API's message
                preprocess=False,
            )
            stop.click(None, cancels=[event], api_visibility="private")
        return demo


def build_ui(config: UIConfig, **kwargs: Any) -> gr.Blocks:
    """The UI as a `gr.Blocks` talking to the service at `config.api_url` (see `StyleVARUI`)."""
    return StyleVARUI(config, **kwargs).blocks()
