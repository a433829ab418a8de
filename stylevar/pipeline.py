"""StylePipeline: a model directory in, PIL images in and out.

A model directory holds `config.json`, `tokenizer.safetensors`, `transformer.safetensors` and a
`README.md` model card. Each model reads and writes its own weights file and config.json section
(`MultiScaleVQVAE` / `StyleVAR`.save_pretrained, from_pretrained); the pipeline composes them and owns
the rest of config.json (`PipelineConfig`). The embedded demo model lives in `stylevar/assets/demo/`.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from PIL import Image

from stylevar.config import StyleVARConfig, VQVAEConfig, presets
from stylevar.devices import resolve_autocast_dtype, resolve_device
from stylevar.generation import GenerationConfig
from stylevar.images import Fit, ResizeMode, fit_square, pil_to_tensor, tensor_to_pil, to_rgb, unfit
from stylevar.postprocess import (MAX_STYLES, OutputOptions, UpsampleMode, check_style_weights, finish,
                                  sample_seeds)
from stylevar.pretrained import CONFIG_FILE, read_config, write_config
from stylevar.palette import Palette, match_palette
from stylevar.refine import Refinement, refine
from stylevar.upsample import Upsampling, upscale
from stylevar.tokenizer import MultiScaleVQVAE
from stylevar.transformer import Condition, StyleBlend, StyleVAR

DEMO_MODEL_DIR = Path(__file__).resolve().parent / "assets" / "demo"
DEMO_LABEL = "demo model (trained on synthetic data)"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class StyleMix:
    """Several style images for one content image, blended by weight, each optionally confined to a region.

    ``weights``: one per image, >= 0, not all 0 (None: equal; they are normalised to sum to 1).
    ``masks``: one grayscale image per style, white = the style applies, black = the content stays
    (grey: partly); any size (resized to the content's, then fitted into the model's square as the
    content is). None: every style everywhere. See `stylevar.transformer.model` for the blend.
    """

    images: tuple[Image.Image, ...]
    weights: tuple[float, ...] | None = None
    masks: tuple[Image.Image, ...] | None = None

    def __post_init__(self) -> None:
        n = len(self.images)
        if not 1 <= n <= MAX_STYLES:
            raise ValueError(f"give 1 to {MAX_STYLES} style images, got {n}")
        if self.weights is not None:
            if len(self.weights) != n:
                raise ValueError(f"style_weights: {len(self.weights)} weights for {n} style images")
            check_style_weights(self.weights)
        if self.masks is not None and len(self.masks) != n:
            raise ValueError(f"style_masks: {len(self.masks)} masks for {n} style images")

    @classmethod
    def of(cls, style: Image.Image | Sequence[Image.Image] | StyleMix, weights: Sequence[float] | None = None,
           masks: Sequence[Image.Image] | None = None) -> StyleMix:
        """A mix from one style image or a list (or a mix, when no weights or masks are given)."""
        if isinstance(style, StyleMix):
            if weights is not None or masks is not None:
                raise ValueError("give weights and masks inside the StyleMix, not beside it")
            return style
        images = (style,) if isinstance(style, Image.Image) else tuple(style)
        return cls(images, None if weights is None else tuple(float(w) for w in weights),
                   None if masks is None else tuple(masks))

    @property
    def plain(self) -> bool:
        """One style without a mask: the published model's computation."""
        return len(self.images) == 1 and self.masks is None

    def active(self) -> StyleMix:
        """The styles of weight > 0 (a style of weight 0 contributes nothing, so it is not computed)."""
        if self.weights is None or all(w > 0 for w in self.weights):
            return self
        keep = [i for i, w in enumerate(self.weights) if w > 0]
        return StyleMix(tuple(self.images[i] for i in keep), tuple(self.weights[i] for i in keep),
                        None if self.masks is None else tuple(self.masks[i] for i in keep))


class ModelDirError(FileNotFoundError):
    """A model directory that is missing or incomplete."""


MODEL_FILES = (CONFIG_FILE, MultiScaleVQVAE.weights_file, StyleVAR.weights_file)


def missing_model_files(path: Path) -> list[str]:
    """The files of a model directory (`MODEL_FILES`) that `path` lacks."""
    return [name for name in MODEL_FILES if not (path / name).is_file()]


@dataclass
class PipelineConfig:
    tokenizer: VQVAEConfig
    transformer: StyleVARConfig
    name: str = "stylevar"
    demo: bool = False
    # the model's recommended generation settings (e.g. {"top_k": 64, "top_p": 0.9}); a caller's explicit
    # value wins, and without either the defaults of `stylevar.generation.GenerationConfig` apply
    generation: dict[str, Any] = field(default_factory=dict)
    # content-guided refinement of the output (stylevar.refine); off unless the model directory asks for it
    refine: Refinement = field(default_factory=Refinement)
    # the style's palette given to the output (stylevar.palette); off unless the model directory asks for it
    palette: Palette = field(default_factory=Palette)
    # how drawings reach the result's size (stylevar.upsample); written to config.json only when not the default
    upsample: Upsampling = field(default_factory=Upsampling)
    extra: dict[str, Any] = field(default_factory=dict)  # provenance: training settings, dates, metrics

    @property
    def label(self) -> str:
        return DEMO_LABEL if self.demo else self.name

    def to_dict(self) -> dict[str, Any]:
        return {"format": "stylevar", "format_version": FORMAT_VERSION, "name": self.name, "demo": self.demo,
                "tokenizer": self.tokenizer.to_dict(), "transformer": self.transformer.to_dict(),
                "generation": self.generation, **({"refine": self.refine.to_dict()} if self.refine.enabled else {}),
                **({"palette": self.palette.to_dict()} if self.palette.enabled else {}),
                **({"upsample": self.upsample.to_dict()} if self.upsample != Upsampling() else {}),
                "extra": self.extra}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PipelineConfig":
        if d.get("format") != "stylevar":
            raise ValueError("config.json is not a StyleVAR model config (missing \"format\": \"stylevar\")")
        return cls(VQVAEConfig.from_dict(d["tokenizer"]), StyleVARConfig.from_dict(d["transformer"]),
                   name=d.get("name", "stylevar"), demo=bool(d.get("demo", False)),
                   generation=dict(d.get("generation", {})), refine=Refinement.from_dict(d.get("refine")),
                   palette=Palette.from_dict(d.get("palette")), upsample=Upsampling.from_dict(d.get("upsample")),
                   extra=d.get("extra", {}))

    @classmethod
    def from_dir(cls, model_dir: str | os.PathLike) -> "PipelineConfig":
        """The config.json of a model directory."""
        return cls.from_dict(read_config(model_dir))


def check_model_dir(path: str | os.PathLike) -> PipelineConfig:
    """The config of the whole model directory at ``path``. A missing file is a ModelDirError naming the
    folder, the files it lacks and how to make one; a config.json that is not a StyleVAR one a ValueError."""
    path = Path(path)
    missing = missing_model_files(path)
    if missing:
        how = ("The embedded demo model is not built yet: run `scripts/train_demo_model.sh` to make it, or pass "
               "another model directory (--model DIR; the service also reads STYLEVAR_MODEL_DIR)."
               if path.resolve() == DEMO_MODEL_DIR.resolve() else
               "A model directory comes from a training run (RUN/final/), `stylevar convert`, or "
               "`StylePipeline.save_pretrained(DIR)`; pass it with --model DIR (the service also reads "
               "STYLEVAR_MODEL_DIR).")
        raise ModelDirError(f"no usable model at {path}: missing {', '.join(missing)}. {how}")
    return PipelineConfig.from_dir(path)


@dataclass(frozen=True)
class Drawings:
    """What the model drew for a batch, at its own resolution, before the result's size is reached."""

    images: torch.Tensor  # (B, 3, S, S) in [0, 1]
    seen: torch.Tensor  # (B, 3, S, S) in [0, 1]: the contents as the model saw them
    fits: list[Fit]  # how each content was fitted into the square


class StylePipeline:
    def __init__(self, model: StyleVAR, config: PipelineConfig):
        self.model = model.eval()
        self.config = config

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def from_models(cls, model: StyleVAR, **config_kwargs) -> "StylePipeline":
        return cls(model, PipelineConfig(model.tokenizer.cfg, model.cfg, **config_kwargs))

    @classmethod
    def random(cls, preset: str | tuple[VQVAEConfig, StyleVARConfig] = "tiny", seed: int = 0,
               name: str = "random-init") -> "StylePipeline":
        """An untrained pipeline (for tests and benchmarks)."""
        vq_cfg, tr_cfg = presets(preset) if isinstance(preset, str) else preset
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = StyleVAR(tr_cfg, MultiScaleVQVAE(vq_cfg))
        return cls.from_models(model, name=name)

    @classmethod
    def from_pretrained(cls, model_dir: str | os.PathLike | None = None, device: str | torch.device | None = None,
                        autocast_dtype: torch.dtype | str | None = "auto") -> "StylePipeline":
        """Load a model directory (default: the embedded demo model), or a hub id ``hf:OWNER/NAME[:variant]``
        (pulled on first use, see `stylevar.hub`). ``autocast_dtype``: "auto" = bf16 on CUDA and none on the
        CPU; None = float32 everywhere; or a dtype or its name ("bf16", "float16", ...; see
        `stylevar.devices.resolve_autocast_dtype`)."""
        from stylevar.hub import resolve_model

        d = resolve_model(model_dir) if model_dir is not None else DEMO_MODEL_DIR
        config = check_model_dir(d)
        model = StyleVAR.from_pretrained(d)
        device = torch.device(device) if device is not None else resolve_device(None)
        model.to(device)
        model.autocast_dtype = resolve_autocast_dtype(autocast_dtype, device)
        return cls(model, config)

    def save_pretrained(self, model_dir: str | os.PathLike, dtype: torch.dtype | None = None,
                        model_card: str | None = None) -> Path:
        """Write the transformer's and the tokenizer's files (floats cast to `dtype` when given), then all of
        config.json from `config`. A model prepared for inference is refused before anything is written."""
        d = self.model.save_pretrained(model_dir, dtype)
        self.model.tokenizer.save_pretrained(d, dtype)
        write_config(d, self.config.to_dict())
        if model_card is not None:
            (d / "README.md").write_text(model_card)
        return d

    # ---- properties ---------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.model.pos_1LC.device

    @property
    def image_size(self) -> int:
        return self.config.tokenizer.image_size

    def summary(self) -> str:
        """What is loaded, in one line: ``NAME: 64 px, 6 scales, 9.12 M parameters (transformer with its image
        encoders 5.88 M: what training.sft trains; tokenizer 3.24 M)``. Counted on the model's parameters:
        call it before `stylevar.inference.prepare`, whose packed layers hold their weights as buffers."""
        total = sum(p.numel() for p in self.model.parameters())
        tok = sum(p.numel() for p in self.model.tokenizer.parameters())
        scales = len(self.config.transformer.patch_nums)
        return (f"{self.config.label}: {self.image_size} px, {scales} scales, {total / 1e6:.2f} M parameters "
                f"(transformer with its image encoders {(total - tok) / 1e6:.2f} M: what training.sft trains; "
                f"tokenizer {tok / 1e6:.2f} M)")

    def to(self, device: str | torch.device) -> "StylePipeline":
        self.model.to(device)
        return self

    # ---- images -------------------------------------------------------------------------------
    def preprocess(self, images: Sequence[Image.Image], resize: ResizeMode = "stretch"
                   ) -> tuple[torch.Tensor, list[Fit]]:
        """PIL images -> (B, 3, S, S) in [-1, 1] on the model's device, and how each was fitted. An image
        object repeated in ``images`` (one request, several seeds) is resized once."""
        done: dict[int, tuple[torch.Tensor, Fit]] = {}
        for im in images:
            if id(im) not in done:
                sq, fit = fit_square(to_rgb(im), self.image_size, resize)
                done[id(im)] = (pil_to_tensor(sq), fit)
        x = torch.stack([done[id(im)][0] for im in images]).to(self.device)
        return x.mul(2).sub(1), [done[id(im)][1] for im in images]

    def mask_tensor(self, mask: Image.Image, content: Image.Image, resize: ResizeMode = "stretch") -> torch.Tensor:
        """A style mask (any mode, any size) -> (S, S) in [0, 1]: resized to the content's size, then
        fitted into the model's square as the content is."""
        gray = mask.convert("L")
        if gray.size != content.size:
            gray = gray.resize(content.size, Image.BILINEAR)
        sq, _ = fit_square(gray.convert("RGB"), self.image_size, resize)
        return pil_to_tensor(sq)[0]

    def style_input(self, contents: Sequence[Image.Image], mixes: Sequence[StyleMix], resize: ResizeMode
                    ) -> torch.Tensor | StyleBlend:
        """The model's style input for a batch: one image tensor when every row is one style without a mask
        (the published computation), else a `StyleBlend`. Every row must have as many styles of weight > 0."""
        mixes = [m.active() for m in mixes]
        counts = {len(m.images) for m in mixes}
        if len(counts) != 1:
            raise ValueError(f"rows of one batch need as many styles each, got {sorted(counts)}")
        if all(m.plain for m in mixes):
            return self.preprocess([m.images[0] for m in mixes], "crop")[0]
        (S,) = counts
        styles = [self.preprocess([m.images[s] for m in mixes], "crop")[0] for s in range(S)]
        weights = torch.tensor([m.weights or (1.0,) * S for m in mixes], dtype=torch.float32, device=self.device)
        masks = None
        if any(m.masks is not None for m in mixes):
            ones = torch.ones(self.image_size, self.image_size)
            masks = torch.stack([
                torch.stack([ones if m.masks is None else self.mask_tensor(m.masks[s], c, resize) for s in range(S)])
                for m, c in zip(mixes, contents)]).to(self.device)
        return StyleBlend(styles, weights, masks)

    def stylize_batch(
        self,
        contents: Sequence[Image.Image],
        styles: Sequence[Image.Image | StyleMix],
        *,
        max_side: int | None = None,
        upsample: UpsampleMode | None = None,
        **draw_kwargs,
    ) -> list[Image.Image]:
        """One `generate` call for a batch (`draw`); each result has its content's aspect ratio (see `unfit`),
        its long side at most ``max_side``. ``upsample``: how the drawing reaches the result's size
        (`stylevar.upsample`; None: the model's setting)."""
        drawn = self.draw(contents, styles, **draw_kwargs)
        up = self.upsampling(upsample)
        return [upscale(img, seen, fit, c, max_side, up)
                for img, seen, fit, c in zip(drawn.images, drawn.seen, drawn.fits, contents)]

    def draw(
        self,
        contents: Sequence[Image.Image],
        styles: Sequence[Image.Image | StyleMix],
        *,
        seeds: Sequence[int] | int | None = None,
        resize: ResizeMode = "stretch",
        on_scale: Callable[[int, torch.Tensor], None] | None = None,
        condition: Callable[[torch.Tensor, torch.Tensor | StyleBlend, bool], Condition] | None = None,
        **gen_kwargs,
    ) -> Drawings:
        """The model's drawings at its own resolution, one `generate` call for the batch, with the model
        directory's palette step and refinement.

        A row's style is one image or a `StyleMix` (every row as many styles of weight > 0). ``condition``
        (content, style inputs, unstyled -> `Condition`) replaces `StyleVAR.condition`, e.g. the service's cache."""
        if len(contents) != len(styles):
            raise ValueError(f"{len(contents)} content images but {len(styles)} style images")
        content, fits = self.preprocess(contents, resize)
        style = self.style_input(contents, [StyleMix.of(s) for s in styles], resize)
        gen = dataclasses.replace(self.generation_config(**gen_kwargs), seed=seeds)
        cond = condition(content, style, gen.guidance > 0) if condition is not None else None
        out = self.model.generate(content, style, on_scale=on_scale, cond=cond, **gen.kwargs())
        out = match_palette(out, style, self.config.palette)  # (B, 3, S, S) in [0, 1]
        seen = content.add(1).mul(0.5)  # (B, 3, S, S) in [0, 1]
        if self.config.refine.enabled:  # guided by the content
            out = refine(out, seen, self.config.refine)
        return Drawings(out, seen, fits)

    def upsampling(self, mode: UpsampleMode | None = None) -> Upsampling:
        """The model's upsampling settings with the caller's mode (None: the model's)."""
        return self.config.upsample if mode is None else dataclasses.replace(self.config.upsample, mode=mode)

    def generation_kwargs(self, **gen_kwargs) -> dict[str, Any]:
        """`generate` keyword arguments: the caller's (None = unset) over the model's recommended ones."""
        return {**self.config.generation, **{k: v for k, v in gen_kwargs.items() if v is not None}}

    def generation_config(self, **gen_kwargs) -> GenerationConfig:
        """The settings a call runs with: the caller's (None = unset) over the model's recommended ones over
        `GenerationConfig`'s defaults."""
        return GenerationConfig.from_kwargs(self.generation_kwargs(**gen_kwargs))

    def __call__(self, content: Image.Image, style: Image.Image | Sequence[Image.Image] | StyleMix, *,
                 style_weights: Sequence[float] | None = None, style_masks: Sequence[Image.Image] | None = None,
                 seed: int | None = None, num_samples: int | None = None, resize: ResizeMode = "stretch",
                 preserve_color: bool = False, max_side: int | None = None, upsample: UpsampleMode | None = None,
                 **gen_kwargs) -> Image.Image | list[Image.Image]:
        """Re-draw ``content`` in the style of ``style``, as ``POST /stylize`` does.

        ``style``: one image, or a list blended by ``style_weights`` (one per style, default equal), each
        confined to its ``style_masks`` image when given (grayscale, white = apply; see `StyleMix`).

        ``num_samples=None`` returns one image; ``num_samples=n`` a list of n (seeds ``seed .. seed+n-1``,
        one model call). ``resize``: how the content is fitted into the model's square (``stretch`` and
        ``pad`` return its aspect ratio, ``crop`` its centre square). ``max_side``: long side of the
        result (None: the content's size). ``preserve_color``: keep the content's colours. ``upsample``:
        ``"guided"`` (the content's fine detail added where the drawing follows it) or ``"bicubic"``, how
        the model's drawing reaches the result's size (None: the model's setting; `stylevar.upsample`).
        ``gen_kwargs``: ``style_strength``, ``top_k``, ``top_p``, ``alphas`` (None: the model's value) and
        ``guidance`` (>= 0, default 0: push away from the prediction without the style; see `StyleVAR`).
        """
        options = OutputOptions(max_side=max_side, preserve_color=preserve_color)
        seeds = sample_seeds(seed, 1 if num_samples is None else num_samples)
        mix = StyleMix.of(style, style_weights, style_masks)
        images = self.stylize_batch([content] * len(seeds), [mix] * len(seeds), seeds=seeds, resize=resize,
                                    max_side=options.max_side, upsample=upsample, **gen_kwargs)
        images = finish(images, content, options)
        return images[0] if num_samples is None else images
