"""The Gradio Blocks UI: the Image tab (inputs, examples, options, a coarse-to-fine preview, results, a baseline,
the model panel) and the Video tab (`web.video_tab`). Every generation goes through the service's HTTP API
(`web.client`); only the baselines run here. The option controls are built from `stylevar.pipelines.options`.
"""
from __future__ import annotations

import io
import random
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import gradio as gr
from PIL import Image, ImageChops, ImageOps

from stylevar.processing.images import ACCEPTED_FORMATS
from stylevar.loaders.model_dir import DEMO_LABEL
from stylevar.pipelines.options import UI, Option, offered
from stylevar.pipelines.request import StylizeRequest
from stylevar.processing.postprocess import MAX_SEED
from stylevar.processing.video import EXTRA as VIDEO_EXTRA
from stylevar.utils.extras import missing_modules

from web.baseline import Baseline, BaselineStatus, default_baselines
from web.client import Preview, Result, ServiceClient, ServiceError
from web.inputs import FileInput, uploaded_path
from web.video_tab import VideoTab

MAX_SCALES = 16  # alpha sliders kept ready; those beyond the model's scale count stay hidden
UI_OPTIONS = {opt.name: opt for opt in offered(UI)}  # the options the UI offers (stylevar.pipelines.options)
CONTROLLED = [opt for opt in UI_OPTIONS.values() if not opt.is_list]  # one control each, named as the option
# the `/stylize` endpoint's parameters after content and style, in a fixed order (gradio_client may pass them by
# position); `LATE_INPUTS` come after the alpha sliders
API_ORDER = ("style_strength", "seed", "top_k", "top_p", "num_samples", "preserve_color", "resize", "adain",
             "adain_alpha", "style2", "style1_weight", "mask", "guidance", "upsample", "custom_alphas")
LATE_INPUTS = ("baseline",)
MAX_MASK_PIXELS = 4096 * 4096  # a painted layer larger than this is refused before it is decoded
# photograph, painting: the examples shown first (sources and licences in the examples' README.md)
PAINTED_PAIRS = (("photo_astronaut.jpg", "painting_church_at_auvers.jpg"),
                 ("photo_dune.jpg", "painting_the_harvest.jpg"),
                 ("photo_cat.jpg", "painting_painter_on_his_way_to_work.jpg"),
                 ("photo_coffee.jpg", "painting_entrance_hall.jpg"))
CSS = """
#preview img { image-rendering: pixelated; width: 100%; height: 100%; object-fit: contain; }
#model-panel { font-size: 0.95em; }
#results .grid-container { height: 100%; }
#results .thumbnail-item { aspect-ratio: auto; }
"""


@dataclass(frozen=True)
class UIConfig:
    """Where the service is and how the UI talks to it."""

    api_url: str  # base URL of the service, e.g. http://127.0.0.1:8000
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 120.0  # longest wait for the next stream event
    concurrency_limit: int = 16  # UI generations in flight at once (the service batches them)
    title: str = "StyleVAR"
    upload_max_age_s: int = 3600  # uploads older than this are deleted ...
    upload_clean_every_s: int = 600  # ... this often (gr.Blocks' delete_cache)


def example_pairs() -> list[list[str]]:
    """`PAINTED_PAIRS`, then `content_*.png` paired in order with `style_*.png`."""
    folder = examples_dir()
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".png"))
    contents = [str(folder / n) for n in names if n.startswith("content_")]
    styles = [str(folder / n) for n in names if n.startswith("style_")]
    painted = [[str(folder / c), str(folder / s)] for c, s in PAINTED_PAIRS]
    return painted + [[c, s] for c, s in zip(contents, styles)]


def painted_mask(value: Any) -> bytes | None:
    """The mask editor's strokes (its layers' alpha) as a black and white PNG; None when nothing is painted."""
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
    return png_bytes(alpha.point(lambda v: 255 if v > 0 else 0))


def png_bytes(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def inverted(mask_png: bytes) -> bytes:
    with Image.open(io.BytesIO(mask_png)) as im:
        return png_bytes(ImageOps.invert(im.convert("L")))


def editor_background(content: FileInput) -> dict[str, Any] | None:
    path = uploaded_path(content)
    return {"background": path, "layers": [], "composite": path} if path else None


def examples_dir() -> Path:
    return Path(str(resources.files("stylevar") / "assets" / "examples"))


def model_markdown(info: dict[str, Any]) -> str:
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
    if info.get("precision"):  # the service settles it when the model loads (docs/cpu.md)
        lines.append(f"Precision {info['precision']}: {info.get('precision_reason', '')}")
    return "\n\n".join(lines)


def tile(images: list[Image.Image]) -> Image.Image:
    if len(images) == 1:
        return images[0]
    h = max(im.height for im in images)
    strip = Image.new("RGB", (sum(im.width for im in images) + 4 * (len(images) - 1), h), (255, 255, 255))
    x = 0
    for im in images:
        strip.paste(im.convert("RGB"), (x, 0))
        x += im.width + 4
    return strip


def control(opt: Option, **layout: Any) -> Any:
    """A radio, checkbox, slider or number box for `opt`, at its `start`, else its default, else its fallback."""
    value = next((v for v in (opt.start, opt.default, opt.fallback) if v is not None), None)
    common = dict(label=opt.label, info=opt.help, elem_id=opt.name.replace("_", "-")) | layout
    if opt.choices:  # the one it starts at first
        return gr.Radio(sorted(opt.choices, key=lambda choice: choice != value), value=value, **common)
    if opt.type is bool:
        return gr.Checkbox(value=value, **common)
    if opt.step is not None:
        return gr.Slider(opt.ge, opt.form_le if opt.ui_le is None else opt.ui_le, value=value, step=opt.step, **common)
    return gr.Number(value=value, precision=0 if opt.number is int else None, minimum=opt.ge, maximum=opt.form_le,
                     **common)


def api_order() -> list[str]:
    late = [opt.name for opt in CONTROLLED if opt.name not in API_ORDER]
    return [*API_ORDER, *late, *(f"alpha_{k + 1}" for k in range(MAX_SCALES)), *LATE_INPUTS]


def baseline_markdown(baselines: Sequence[Baseline], statuses: Mapping[str, BaselineStatus]) -> str:
    lines = []
    for b in baselines:
        state = statuses[b.name]
        lines.append(f"**{b.label}{'' if state.available else ' disabled'}:** {state.reason}")
    return "\n\n".join(lines)


class StyleVARUI:
    """Event handlers around one `ServiceClient`; `blocks()` lays out the page."""

    def __init__(self, config: UIConfig, *, client: ServiceClient | None = None,
                 baselines: Sequence[Baseline] | None = None):
        self.config = config
        self.client = client or ServiceClient(config.api_url, api_key=config.api_key, timeout_s=config.timeout_s)
        self.baselines = {b.name: b for b in (default_baselines() if baselines is None else baselines)}
        self.baseline_statuses: dict[str, BaselineStatus] = {n: b.status() for n, b in self.baselines.items()}
        # the panel starts at the first baseline that can run (Magenta, when its extra is installed)
        self.default_baseline = next((n for n, st in self.baseline_statuses.items() if st.available),
                                     next(iter(self.baselines), None))

    # ---- handlers ---------------------------------------------------------------------------------
    def on_load(self) -> list[Any]:
        """Model panel, top-k/top-p, the alpha sliders, and the baseline box ticked where it can run."""
        run_baseline = gr.update(value=self.baseline_ready())
        try:
            info = self.client.model_info()
        except ServiceError as e:
            return [f"**Model: unknown.** {e.message}", gr.update(), gr.update(),
                    *[gr.update(visible=False)] * MAX_SCALES, run_baseline]
        generation = info.get("config", {}).get("generation", {})
        top_k = gr.update(value=generation.get("top_k", UI_OPTIONS["top_k"].fallback))
        top_p = gr.update(value=generation.get("top_p", UI_OPTIONS["top_p"].fallback))
        patch_nums, defaults = info.get("patch_nums", []), info.get("default_alphas", [])
        sliders = []
        for k in range(MAX_SCALES):
            if k < len(patch_nums):
                value = defaults[k] if k < len(defaults) else 0.5
                label = f"α, scale {k + 1} ({patch_nums[k]}×{patch_nums[k]})"
                sliders.append(gr.update(visible=True, value=value, label=label))
            else:
                sliders.append(gr.update(visible=False))
        return [model_markdown(info), top_k, top_p, *sliders, run_baseline]

    def baseline_ready(self) -> bool:
        return self.default_baseline is not None and self.baseline_statuses[self.default_baseline].available

    def stylize(self, content: FileInput, style: FileInput, style2: FileInput = None, mask: Any = None,
                **values: Any) -> Iterator[tuple[Any, Any, Any, Any]]:
        """Yields (preview, results gallery, status, baseline image) as the picture forms coarse to fine; each
        message carries all four (None: empty), never one of Gradio's update objects, which an API caller
        (gradio_client) would receive as they are.

        `content`, `style` and `style2` are uploaded files: a path, or Gradio's file data (the event does not
        preprocess its inputs). With `style2` the two styles are blended; strokes painted in the `mask` editor
        confine the first style to them (and the second, if any, to the rest). ``values``: the controls' values by
        name (`api_order`): the options the UI offers, named as in `stylevar.pipelines.options`, and `adain` (run the
        baseline), `adain_alpha` (its strength), `baseline` (which: `magenta` or `adain`; default the panel's),
        `style1_weight` (the first style's weight), `custom_alphas` and `alpha_1` .. `alpha_16`. The baseline
        runs only when `adain` is true: the page ticks it on load where one can run, an API caller asks for it."""
        content, style, style2 = uploaded_path(content), uploaded_path(style), uploaded_path(style2)
        if not content or not style:
            raise gr.Error("Add a content image and a style image first (upload, paste, webcam, or pick an example).",
                           print_exception=False)
        painted = painted_mask(mask)
        styles = [style, style2] if style2 else [style]
        masks = None if painted is None else ([painted, inverted(painted)] if style2 else [painted])
        options = self.options(values, two_styles=bool(style2))
        baseline = self._baseline(values)
        yield None, None, "Sending the images to the service…", None
        result: Result | None = None
        preview = None
        try:
            for event in self.client.stylize_stream(content, styles, options, masks):
                if isinstance(event, Preview):
                    status = (f"Generating: scale {event.scale + 1} of {event.num_scales} "
                              f"({event.patch_num}×{event.patch_num} tokens)…")
                    preview = tile(event.images)
                    yield preview, None, status, None
                else:
                    result = event
        except ServiceError as e:
            yield preview, None, f"**Error:** {e.message}", None
            raise gr.Error(e.message, print_exception=False) from None
        assert result is not None  # stylize_stream ends with a Result or raises
        gallery = [(r.image, f"seed {r.seed}") for r in result.images]
        status = (f"Done: {len(result.images)} image(s) from `{result.model}` in {result.inference_ms:.0f} ms "
                  f"(seed {result.seed}).") + (f" **Note:** {result.warning}." if result.warning else "")
        final = tile([r.image for r in result.images])
        if baseline is None:
            yield final, gallery, status, None
        else:
            yield from self._run_baseline(baseline, content, style, values, (final, gallery, status))

    def _run_baseline(self, baseline: Baseline, content: str, style: str, values: Mapping[str, Any],
                      done: tuple[Any, Any, str]) -> Iterator[tuple[Any, Any, Any, Any]]:
        final, gallery, status = done
        state = self.baseline_statuses[baseline.name]
        if not state.available:  # the panel says why; so does the status line
            yield final, gallery, status + f" {baseline.label} not run: {state.reason}", None
            return
        yield final, gallery, status + f" Running {baseline.label}…", None
        try:
            image = baseline.stylize(content, style, alpha=values.get("adain_alpha", 1.0))
        except Exception as e:  # noqa: BLE001 - the StyleVAR result stands; say why the baseline did not
            yield final, gallery, status + f" {baseline.label} failed: {e}", None
            return
        yield final, gallery, status, image

    def _baseline(self, values: Mapping[str, Any]) -> Baseline | None:
        if not values.get("adain"):
            return None
        name = values.get("baseline") or self.default_baseline
        if name not in self.baselines:
            raise gr.Error(f"Baseline must be one of {', '.join(self.baselines)}.", print_exception=False)
        return self.baselines[name]

    def options(self, values: Mapping[str, Any], two_styles: bool) -> StylizeRequest:
        for opt in CONTROLLED:
            if opt.choices and values.get(opt.name) not in (None, *opt.choices):
                raise gr.Error(f"{opt.label} must be one of {', '.join(opt.choices)}.", print_exception=False)
        chosen = {opt.name: values.get(opt.name) for opt in CONTROLLED}
        if two_styles:
            w = min(max(float(values.get("style1_weight", 0.5)), 0.0), 1.0)
            chosen["style_weights"] = (w, 1.0 - w)
        try:
            if values.get("custom_alphas"):
                chosen["alphas"] = self._alphas([values.get(f"alpha_{k + 1}", 0.5) for k in range(MAX_SCALES)])
            return StylizeRequest.of(**chosen)
        except ServiceError as e:
            raise gr.Error(e.message, print_exception=False) from None
        except ValueError as e:
            raise gr.Error(f"Invalid input: {e}.", print_exception=False) from None

    def _alphas(self, alphas: list[float]) -> tuple[float, ...]:
        n = len(self.client.model_info().get("patch_nums", []))
        if not 0 < n <= len(alphas):
            raise ServiceError(422, "validation_error", f"the model has {n} scales; the UI has {len(alphas)} alphas")
        return tuple(float(a) for a in alphas[:n])

    # ---- layout -----------------------------------------------------------------------------------
    def blocks(self) -> gr.Blocks:
        cleaning = (self.config.upload_clean_every_s, self.config.upload_max_age_s)
        with gr.Blocks(title=self.config.title, analytics_enabled=False, delete_cache=cleaning) as demo:
            gr.Markdown(f"# {self.config.title}\nRe-draw a **content** picture in the look of a **style** picture. "
                        "The model draws coarse to fine, one token map per scale; watch it form in the preview.")
            c: dict[str, Any] = {"model_panel": gr.Markdown("Loading model information…", elem_id="model-panel")}
            with gr.Tab("Image", id="image-tab"):
                with gr.Row():
                    with gr.Column(scale=3):
                        self._inputs(c)
                        with gr.Accordion("Advanced", open=False):
                            self._advanced(c)
                        with gr.Row():
                            c["run"] = gr.Button("Stylize", variant="primary", elem_id="stylize-button", scale=3)
                            c["stop"] = gr.Button("Stop", variant="stop", scale=1)
                    pairs = example_pairs()
                    if pairs:
                        with gr.Column(scale=2):
                            gr.Examples(pairs, inputs=[c["content"], c["style"]], label="Examples (content, style)",
                                        examples_per_page=len(PAINTED_PAIRS), cache_examples=False, elem_id="examples")
                c["status"] = gr.Markdown("", label="Status", elem_id="status")  # the label names the API's output
                self._outputs(c)
            # a short clip through POST /stylize/video; hidden where video is not installed (the route answers 501)
            with gr.Tab("Video", id="video-tab", visible=not missing_modules(VIDEO_EXTRA)):
                VideoTab(self.client).blocks()
            self._wire(demo, c)
        return demo

    def _inputs(self, c: dict[str, Any]) -> None:
        with gr.Row(equal_height=True):
            c["content"] = gr.Image(label="Content", type="filepath", image_mode=None, height=260,
                                    sources=["upload", "clipboard", "webcam"], elem_id="content-input")
            c["style"] = gr.Image(label="Style", type="filepath", image_mode=None, height=260,
                                  sources=["upload", "clipboard", "webcam"], elem_id="style-input")
        with gr.Row(equal_height=True):
            c["style_strength"] = control(UI_OPTIONS["style_strength"], scale=3)
            # the help's first sentence, one line at 1280 px (the rest, seeds across devices: docs/gpus.md)
            c["seed"] = control(UI_OPTIONS["seed"], scale=2, info=UI_OPTIONS["seed"].help.split(". ")[0])
            c["dice"] = gr.Button("Randomise seed", scale=0, min_width=110, elem_id="randomise-seed")

    def _advanced(self, c: dict[str, Any]) -> None:
        placed = {"style_strength", "seed"}
        for row in (("top_k", "top_p", "num_samples"), ("preserve_color", "resize", "upsample")):
            with gr.Row():
                c.update({name: control(UI_OPTIONS[name]) for name in row})
            placed.update(row)
        with gr.Row(equal_height=True):
            c["style2"] = gr.Image(label="Second style (optional)", type="filepath", image_mode=None,
                                   height=200, sources=["upload", "clipboard"], elem_id="style2-input")
            with gr.Column():
                weights = UI_OPTIONS["style_weights"]  # with a second style: (w, 1 - w)
                c["style1_weight"] = gr.Slider(0.0, 1.0, value=0.5, step=0.05, label=weights.label,
                                               info=f"{weights.help}: with a second style, 1 = the first only, 0 = "
                                                    "the second only", elem_id="style-weight")
                c.update({opt.name: control(opt) for opt in CONTROLLED if opt.name not in placed})
        c["mask"] = gr.ImageEditor(label="Mask: paint where the first style applies (the second style, or the "
                                         "content, keeps the rest); nothing painted = everywhere",
                                   type="filepath", sources=(), transforms=(), layers=False, height=280,
                                   brush=gr.Brush(colors=["#ff2d75"], color_mode="fixed", default_size=10),
                                   elem_id="mask-editor")
        alphas = UI_OPTIONS["alphas"]
        c["custom_alphas"] = gr.Checkbox(value=False, label=alphas.label, info=alphas.describe("off"),
                                         elem_id="custom-alphas")
        with gr.Row():
            for k in range(MAX_SCALES):
                c[f"alpha_{k + 1}"] = gr.Slider(alphas.ge, alphas.le, value=0.5, step=0.05, label=f"α, scale {k + 1}",
                                                visible=False, min_width=120)

    def _outputs(self, c: dict[str, Any]) -> None:
        statuses = self.baseline_statuses
        default = self.baselines.get(self.default_baseline or "")
        ok = self.baseline_ready()
        with gr.Row(equal_height=True):
            c["preview"] = gr.Image(label="Coarse-to-fine preview", interactive=False, format="png", height=300,
                                    elem_id="preview", buttons=["fullscreen"])
            c["results"] = gr.Gallery(label="Results", format="png", columns=2, height=300, elem_id="results",
                                      object_fit="contain", buttons=["download", "download_all", "fullscreen"],
                                      interactive=False)
            with gr.Column():
                c["adain_img"] = gr.Image(label=baseline_label(default), interactive=False, format="png",
                                          height=220, elem_id="adain-output")
                c["baseline"] = gr.Radio([(b.label, n) for n, b in self.baselines.items()], label="Baseline",
                                         value=self.default_baseline, interactive=ok, elem_id="baseline-choice",
                                         info="Magenta (Ghiasi et al. 2017) or AdaIN, run in the UI's process")
                c["adain"] = gr.Checkbox(value=False, interactive=ok, label="Run the baseline beside StyleVAR",
                                         elem_id="run-baseline")  # ticked on load (`on_load`): off for the API
                c["adain_alpha"] = gr.Slider(0.0, 1.0, value=1.0, step=0.05, label="Baseline strength",
                                             info="AdaIN's alpha; Magenta's style vector from the content's (0) "
                                                  "to the style's (1)", interactive=ok)
                gr.Markdown(baseline_markdown(list(self.baselines.values()), statuses), elem_id="adain-status")

    def _wire(self, demo: gr.Blocks, c: dict[str, Any]) -> None:
        alpha_sliders = [c[f"alpha_{k + 1}"] for k in range(MAX_SCALES)]
        demo.load(self.on_load, outputs=[c["model_panel"], c["top_k"], c["top_p"], *alpha_sliders, c["adain"]],
                  api_visibility="private")
        c["dice"].click(lambda: random.randint(0, MAX_SEED), outputs=c["seed"], api_visibility="private")
        # the mask is painted on the content: a new content clears the strokes (no decoding here)
        c["content"].change(editor_background, inputs=c["content"], outputs=c["mask"], api_visibility="private",
                            preprocess=False)
        c["baseline"].change(lambda name: gr.update(label=baseline_label(self.baselines.get(name))),
                             inputs=c["baseline"], outputs=c["adain_img"], api_visibility="private")
        event = c["run"].click(
            self.stylize, inputs=[c["content"], c["style"]], inputs_kwargs={name: c[name] for name in api_order()},
            outputs=[c["preview"], c["results"], c["status"], c["adain_img"]],
            api_name="stylize", concurrency_limit=self.config.concurrency_limit,
            preprocess=False,  # the service decodes the uploads (bounded) and says what is wrong with one
        )
        c["stop"].click(None, cancels=[event], api_visibility="private")


def baseline_label(baseline: Baseline | None) -> str:
    return f"{baseline.label} (baseline)" if baseline is not None else "Baseline"


def build_ui(config: UIConfig, **kwargs: Any) -> gr.Blocks:
    return StyleVARUI(config, **kwargs).blocks()
