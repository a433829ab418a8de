"""One stylize request: every option declared once (type, range, help), validated once, resolved once.

`StylizeRequest` is a pydantic model whose fields carry their range, help and `Offer`; every surface builds one,
so its errors (`RequestError`) read the same everywhere. No torch: the command line's --help reads it.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from PIL import Image
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from stylevar.config import DEFAULT_GENERATION, GenerationConfig
from stylevar.processing.images import Picture, ResizeMode, as_image
from stylevar.processing.postprocess import (DEFAULT_UPSAMPLE, MAX_SEED, MAX_STYLES, OutputOptions, UpsampleMode,
                                             check_style_weights)
from stylevar.utils.errors import unknown_name

FORM, CLI, UI, PYTHON = "form", "cli", "ui", "python"  # the service's form, the command line, the UI, the pipeline
EVERYWHERE = frozenset({FORM, CLI, UI, PYTHON})
NO_FLAG = EVERYWHERE - {CLI}  # the per-scale alphas: the command line has no flag for them
OutputFormat = Literal["png", "jpeg", "webp"]


@dataclass(frozen=True)
class Offer:
    """How the surfaces offer an option (a field's metadata; its type, range, default and help are the field's)."""

    label: str = ""  # the UI control's label
    unset: str = ""  # what leaving it out (None) means; "" for an option that always has a value
    fallback: Any = None  # the value an absent one comes to where the model says nothing
    start: Any = None  # where the command line and the UI start when the service's absent value suits only it
    surfaces: frozenset[str] = EVERYWHERE
    step: float | None = None  # the UI slider's step (None: a number box, a radio or a checkbox)
    ui_le: float | None = None  # the UI slider's end, where it stops short of `le`
    served_le: float | None = None  # the service's and the UI's bound, where it is below the library's
    max_chars: int | None = None  # the longest form text of a list option
    example: str = ""


def numbers(value: Any) -> Any:
    """A list option given as text (`0.2,0.3` or `[0.2, 0.3]`; blank: left out) as its items; else as it is."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text:
        return None
    if not text.startswith("["):
        return [part.strip() for part in text.split(",")]
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError("give numbers separated by commas, or a JSON list of numbers") from None


def style_weights_rule(weights: tuple[float, ...] | None) -> tuple[float, ...] | None:
    """The weights as the model computes with them (`check_style_weights`: the float32 rule)."""
    return None if weights is None else check_style_weights(weights)


Unit = Annotated[float, Field(ge=0.0, le=1.0)]
Alphas = Annotated[tuple[Unit, ...] | None, BeforeValidator(numbers)]
StyleWeights = Annotated[tuple[float, ...] | None, Field(max_length=MAX_STYLES), BeforeValidator(numbers),
                         AfterValidator(style_weights_rule)]
G = DEFAULT_GENERATION  # the sampling and blend defaults: the declaration reads them, it does not repeat them
GENERATION = ("style_strength", "top_k", "top_p", "alphas", "guidance", "fast")  # GenerationConfig's, but the seed
IMAGE_ONLY = ("num_samples", "format")  # what a clip does not take (one mp4 out, one result per frame)


class RequestError(ValueError):
    """A request the declaration refuses: one line per error, ``name: message``, as the service's 422 says it."""

    def __init__(self, errors: Sequence[Mapping[str, Any]]):
        self.errors = [dict(e) for e in errors]  # pydantic's error dicts (the service re-raises them as a 422)
        super().__init__("; ".join(error_text(e) for e in self.errors))


def error_text(error: Mapping[str, Any]) -> str:
    loc = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
    return f"{loc}: {error.get('msg', 'invalid')}" if loc else str(error.get("msg", "invalid"))


class StylizeRequest(BaseModel):
    """The generation and output options of one stylize request; None: left out (see each `Offer.unset`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, defer_build=True)  # fast --help

    style_strength: Annotated[float, Offer(label="Style strength", step=0.05)] = Field(
        G.style_strength, ge=-1.0, le=1.0, description="-1 keeps more of the content .. 1 takes more of the style")
    seed: Annotated[int | None, Offer(label="Seed", unset="a random one", start=0)] = Field(
        None, ge=0, le=MAX_SEED, description="the random seed; sample i uses seed + i. It reproduces a picture on the "
        "same kind of device in the same precision: a GPU's seed does not give its picture on the CPU (docs/gpus.md)")
    top_k: Annotated[int | None, Offer(label="Top-k", fallback=G.top_k,
                                       unset=f"the model's recommended value, else {G.top_k}")] = Field(
        None, ge=0, le=1_000_000, description="0 switches top-k off")
    top_p: Annotated[float | None, Offer(label="Top-p", step=0.01, fallback=G.top_p,
                                         unset=f"the model's recommended value, else {G.top_p}")] = Field(
        None, ge=0.0, le=1.0, description="0 or 1 switches top-p off")
    num_samples: Annotated[int, Offer(label="Number of samples", step=1, served_le=4)] = Field(
        1, ge=1, description="samples per content image; sample i uses seed + i")
    alphas: Annotated[Alphas, Offer(  # 4096 characters: far more than any model's scale count needs
        label="Custom per-scale alphas", unset="the model's own", surfaces=NO_FLAG, max_chars=4096,
        example="0.2,0.3,0.4,0.5,0.6,0.7")] = Field(
        None, description="the blend weight of the style (1) against the content (0) at each scale, coarse to fine: "
                          "one number in [0, 1] per scale")
    resize: Annotated[ResizeMode, Offer(label="Resize mode")] = Field(
        "stretch", description="how the content is fitted into the model's square: stretch squeezes it into the "
        "square (the model draws it distorted) and stretches the result back to the content's shape; pad letterboxes "
        "it undistorted (bands of its mean colour, cut off the result again); crop draws only its centre square and "
        "returns that square")
    preserve_color: Annotated[bool, Offer(label="Preserve colour")] = Field(
        False, description="keep the content's colours: the result's brightness (luminance) with the content's hue "
                           "and saturation (chroma), so the style changes only light and dark")
    upsample: Annotated[UpsampleMode | None, Offer(
        label="Upsampling", fallback=DEFAULT_UPSAMPLE,
        unset=f"the model's setting, {DEFAULT_UPSAMPLE} unless its config.json says otherwise")] = Field(
        None, description="how the model's drawing reaches the result's size: guided adds the content's fine detail "
                          "where the drawing follows the content, bicubic only resizes")
    format: Annotated[OutputFormat, Offer(surfaces=frozenset({FORM, CLI}))] = Field(
        "png", description="output format: png, jpeg or webp")
    style_weights: Annotated[StyleWeights, Offer(  # 256 characters: MAX_STYLES numbers
        label="Weight of the first style", unset="equal", max_chars=256, example="0.7,0.3")] = Field(
        None, description=f"one weight >= 0 per style image (at most {MAX_STYLES}), in their order (not all 0; "
                          "normalised to sum to 1)")
    guidance: Annotated[float, Offer(label="Style guidance", step=0.25, ui_le=4.0)] = Field(  # 10: far past where
        G.guidance, ge=0.0, le=10.0,  # pictures stop looking like anything; the UI's slider ends at 4
        description="push the result away from what the model draws without the style (the content as its own "
                    "style): 0 = off; larger = more style, less content")
    fast: Annotated[bool, Offer(label="Fast sampling")] = Field(
        G.fast, description="compute the finest scales' flat regions (2 x 2 positions where the content has little "
                            "detail) as one token each: fewer transformer rows, a little less of the content's detail")

    @classmethod
    def of(cls, **values: Any) -> StylizeRequest:
        """From keyword values, None meaning left out. An unknown name is a TypeError; a value the declaration
        refuses a `RequestError` (a ValueError) with the service's message."""
        unknown = set(values) - set(cls.model_fields)
        if unknown:
            raise TypeError("; ".join(unknown_name("stylize option", k, cls.model_fields) for k in sorted(unknown)))
        try:
            return cls(**{k: v for k, v in values.items() if v is not None})
        except ValidationError as e:
            raise RequestError(e.errors(include_url=False)) from None

    def given(self) -> dict[str, Any]:
        """The options that are set and differ from their defaults."""
        fields = type(self).model_fields
        return {k: getattr(self, k) for k in fields if getattr(self, k) not in (None, fields[k].default)}

    def generation(self, recommended: Mapping[str, Any]) -> GenerationConfig:
        """The generation settings: this request's (None = unset) over the model's ``recommended`` ones (its
        config.json) over `GenerationConfig`'s defaults; no seed (each row has its own)."""
        return GenerationConfig.resolve(recommended, **{k: getattr(self, k) for k in GENERATION})


def check_mix_counts(styles: int, weights: int | None = None, masks: int | None = None,
                     masks_name: str = "style_masks") -> None:
    """A blend's counts agree: 1 to `MAX_STYLES` style images, one weight and one mask per style where given; the
    one check of every surface (a ValueError naming the masks as `masks_name`)."""
    if not 1 <= styles <= MAX_STYLES:
        raise ValueError(f"style: give 1 to {MAX_STYLES} style images, got {styles}")
    if weights is not None and weights != styles:
        raise ValueError(f"style_weights: {weights} weights for {styles} style images; give one per style")
    if masks is not None and masks != styles:
        raise ValueError(f"{masks_name}: {masks} masks for {styles} style images; give one per style")


@dataclass(frozen=True)
class StyleMix:
    """Several style images for one content image, blended by weight, each optionally confined to a region.

    ``weights``: one per image, >= 0, not all 0 (None: equal; normalised to sum to 1). ``masks``: one grayscale
    image per style of any size, white = the style applies, black = the content stays; None: everywhere.
    """

    images: tuple[Image.Image, ...]
    weights: tuple[float, ...] | None = None
    masks: tuple[Image.Image, ...] | None = None

    def __post_init__(self) -> None:
        check_mix_counts(len(self.images), None if self.weights is None else len(self.weights),
                         None if self.masks is None else len(self.masks))
        if self.weights is not None:
            check_style_weights(self.weights)

    @classmethod
    def of(cls, style: Picture | Sequence[Picture] | StyleMix, weights: Sequence[float] | None = None,
           masks: Sequence[Picture] | None = None) -> StyleMix:
        """A mix from one style image or a list (or a mix, when no weights or masks are given); an image may be
        given by its path (`as_image`)."""
        if isinstance(style, StyleMix):
            if weights is not None or masks is not None:
                raise ValueError("give weights and masks inside the StyleMix, not beside it")
            return style
        styles = [style] if isinstance(style, (Image.Image, str, os.PathLike)) else list(style)
        images = tuple(as_image(s, "style" if len(styles) == 1 else f"style {i + 1}") for i, s in enumerate(styles))
        return cls(images, None if weights is None else tuple(float(w) for w in weights),
                   None if masks is None else tuple(as_image(m, f"style mask {i + 1}") for i, m in enumerate(masks)))

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


@dataclass(frozen=True)
class BatchKey:
    """What must be equal for stylizations to share one `generate` call; hashable."""

    generation: GenerationConfig
    resize: ResizeMode
    num_styles: int  # styles of weight > 0: rows of one call need as many
    upsample: UpsampleMode | None  # None: the model's setting


@dataclass(frozen=True)
class Stylization:
    """A request resolved against a model for one content image: what `StylePipeline.run` draws."""

    request: StylizeRequest
    content: Image.Image | None  # None: a clip's (each frame is the content of its row)
    mix: StyleMix  # the styles of weight > 0
    generation: GenerationConfig  # resolved once: the request's over the model's over the defaults
    seeds: tuple[int, ...]  # one row each
    output: OutputOptions  # the result's long side, whether the content's colours are kept

    @property
    def key(self) -> BatchKey:
        r = self.request
        return BatchKey(self.generation, r.resize, len(self.mix.images), r.upsample)

    @property
    def style(self) -> Image.Image | StyleMix:
        """The rows' style input: the image itself for one style without a mask (the published computation)."""
        return self.mix.images[0] if self.mix.plain else self.mix
