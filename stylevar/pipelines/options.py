"""The options of one stylize request, declared once.

`StylizeOptions` holds each option's type and default; the metadata of each field (an `Option`) its range,
its help text, the rule beyond the range (list options) and the surfaces that offer it. The sampling and
blend defaults are `stylevar.models.generation.DEFAULT_GENERATION`'s (the one place they live: the model and its
config.json's recommendations use them without any request around). Derived from this declaration: the
service's form (`serve.http.schemas.StylizeForm`), the web client's form encoding (`web.client`), the UI's
controls and its handler's values (`web.ui`), the command line's stylize flags (`stylevar.cli.stylize`) and
the keyword arguments of `StylePipeline.__call__`. No torch here: the command line's --help reads it.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from stylevar.models.generation import DEFAULT_GENERATION
from stylevar.processing.images import ResizeMode
from stylevar.processing.postprocess import DEFAULT_UPSAMPLE, MAX_SEED, MAX_STYLES, UpsampleMode, check_style_weights

FORM, CLI, UI, PYTHON = "form", "cli", "ui", "python"  # the service's form, the command line, the UI, the pipeline
EVERYWHERE = frozenset({FORM, CLI, UI, PYTHON})
OutputFormat = Literal["png", "jpeg", "webp"]


@dataclass(frozen=True)
class Option:
    """How one option is offered; `name`, `type`, `optional` and `default` are filled in from its field."""

    help: str  # what it does: the form field's description, the flag's help, the control's info
    ge: float | None = None  # the smallest value (of each number, for a list option)
    le: float | None = None  # the largest
    unset: str = ""  # what leaving it out (None) means; "" for an option that always has a value
    fallback: Any = None  # the value an absent one comes to where the model says nothing
    start: Any = None  # where the command line and the UI start when the service's absent value suits only it
    rule: Callable[[Any], Any] | None = None  # a check beyond the range: returns the value or raises ValueError
    surfaces: frozenset[str] = EVERYWHERE
    label: str = ""  # the UI control's label
    step: float | None = None  # the UI slider's step (None: a number box, a radio or a checkbox)
    ui_le: float | None = None  # the UI slider's end, where it stops short of `le`
    max_chars: int | None = None  # the longest form text of a list option
    example: str = ""
    name: str = ""
    type: Any = None  # the value's type, None left out (a Literal for a choice)
    optional: bool = False  # None is a value: the option left out
    default: Any = None

    @property
    def choices(self) -> tuple[str, ...]:
        return typing.get_args(self.type) if typing.get_origin(self.type) is Literal else ()

    @property
    def is_list(self) -> bool:
        return typing.get_origin(self.type) is tuple

    @property
    def number(self) -> type | None:
        """int or float for a number or a list of numbers; None otherwise."""
        kind = typing.get_args(self.type)[0] if self.is_list else self.type
        return kind if kind in (int, float) else None

    def on(self, surface: str) -> bool:
        return surface in self.surfaces

    def describe(self, absent: str, encoding: str = "") -> str:
        """The help text with what leaving it out means (``absent``: "absent", "default")."""
        return f"{self.help}{encoding}; {absent}: {self.unset}" if self.unset else f"{self.help}{encoding}"

    def check(self, value: Any) -> Any:
        """``value`` if the option's range, choices and rule allow it, else a ValueError naming the option."""
        if value is None:
            if self.optional:
                return None
            raise ValueError(f"{self.name} must be given")
        items = tuple(value) if self.is_list else (value,)
        if self.choices and value not in self.choices:
            raise ValueError(f"{self.name} must be one of {', '.join(self.choices)}, not {value!r}")
        low = -float("inf") if self.ge is None else self.ge
        high = float("inf") if self.le is None else self.le
        if self.number is not None and not all(low <= v <= high for v in items):
            where = f"every one of the {self.name}" if self.is_list else self.name
            raise ValueError(f"{where} must lie in [{low:g}, {high:g}]")
        return self.rule(value) if self.rule is not None else value


def option(default: Any, **meta: Any) -> Any:
    """A `StylizeOptions` field: its default and its `Option`."""
    return field(default=default, metadata={"option": Option(**meta)})


def style_weights_rule(weights: Sequence[float]) -> tuple[float, ...]:
    """At most MAX_STYLES weights, as the model computes with them (`check_style_weights`)."""
    if len(weights) > MAX_STYLES:
        raise ValueError(f"at most {MAX_STYLES} style weights, got {len(weights)}")
    return check_style_weights(weights)


G = DEFAULT_GENERATION  # the sampling and blend defaults: the declaration reads them, it does not repeat them
NO_FLAG = EVERYWHERE - {CLI}  # the per-scale alphas: the command line has no flag for them


@dataclass(frozen=True)
class StylizeOptions:
    """The generation and output options of one stylize request; None: left out (see each `unset`)."""

    style_strength: float = option(
        G.style_strength, ge=-1.0, le=1.0, help="-1 keeps more of the content .. 1 takes more of the style",
        label="Style strength", step=0.05)
    seed: int | None = option(
        None, ge=0, le=MAX_SEED, help="the random seed; sample i uses seed + i", unset="a random one", start=0,
        label="Seed")
    top_k: int | None = option(
        None, ge=0, le=1_000_000, help="0 switches top-k off", fallback=G.top_k,
        unset=f"the model's recommended value, else {G.top_k}", label="Top-k")
    top_p: float | None = option(
        None, ge=0.0, le=1.0, help="0 or 1 switches top-p off", fallback=G.top_p,
        unset=f"the model's recommended value, else {G.top_p}", label="Top-p", step=0.01)
    num_samples: int = option(
        1, ge=1, le=4, help="samples per content image; sample i uses seed + i", label="Number of samples", step=1)
    alphas: tuple[float, ...] | None = option(  # 4096 characters: far more than any model's scale count needs
        None, ge=0.0, le=1.0, unset="the model's own", surfaces=NO_FLAG, max_chars=4096,
        help="the blend weight of the style (1) against the content (0) at each scale, coarse to fine: one number "
             "in [0, 1] per scale", example="0.2,0.3,0.4,0.5,0.6,0.7", label="Custom per-scale alphas")
    resize: ResizeMode = option(
        "stretch", label="Resize mode",
        help="how the content is fitted into the model's square: stretch squeezes it into the square (the model "
             "draws it distorted) and stretches the result back to the content's shape; pad letterboxes it "
             "undistorted (bands of its mean colour, cut off the result again); crop draws only its centre square "
             "and returns that square")
    preserve_color: bool = option(
        False, label="Preserve colour",
        help="keep the content's colours: the result's brightness (luminance) with the content's hue and saturation "
             "(chroma), so the style changes only light and dark")
    upsample: UpsampleMode | None = option(
        None, fallback=DEFAULT_UPSAMPLE, label="Upsampling",
        unset=f"the model's setting, {DEFAULT_UPSAMPLE} unless its config.json says otherwise",
        help="how the model's drawing reaches the result's size: guided adds the content's fine detail where the "
             "drawing follows the content, bicubic only resizes")
    format: OutputFormat = option(
        "png", help="output format: png, jpeg or webp", surfaces=frozenset({FORM, CLI}))
    style_weights: tuple[float, ...] | None = option(  # 256 characters: MAX_STYLES numbers
        None, rule=style_weights_rule, unset="equal", max_chars=256, example="0.7,0.3",
        label="Weight of the first style",
        help=f"one weight >= 0 per style image (at most {MAX_STYLES}), in their order (not all 0; normalised to sum "
             "to 1)")
    guidance: float = option(  # 10: far past where pictures stop looking like anything; the UI's slider ends at 4
        G.guidance, ge=0.0, le=10.0, ui_le=4.0, label="Style guidance", step=0.25,
        help="push the result away from what the model draws without the style (the content as its own style): "
             "0 = off; larger = more style, less content")
    fast: bool = option(
        G.fast, label="Fast sampling",
        help="compute the finest scales' flat regions (2 x 2 positions where the content has little detail) as one "
             "token each: fewer transformer rows, a little less of the content's detail")

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> StylizeOptions:
        """From values of types each option converts from (a UI's floats), None meaning left out (the default).
        An unknown name is a TypeError; a value of the wrong kind a ValueError naming the option."""
        unknown = set(values) - set(DECLARED)
        if unknown:
            raise TypeError(f"unknown stylize option(s): {', '.join(sorted(unknown))}")
        return cls(**{k: convert(DECLARED[k], v) for k, v in values.items() if v is not None})

    def given(self) -> dict[str, Any]:
        """The options that are set and differ from their defaults."""
        return {k: getattr(self, k) for k, opt in DECLARED.items() if getattr(self, k) not in (None, opt.default)}


def convert(opt: Option, value: Any) -> Any:
    """``value`` as the option's type (int, float, bool, a choice, a tuple of numbers)."""
    try:
        if opt.is_list:
            return tuple(float(v) for v in value)
        if opt.type is bool:
            return bool(value)
        if opt.number is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        return opt.number(value) if opt.number is not None else value
    except (TypeError, ValueError):
        kind = "numbers" if opt.is_list else "an integer" if opt.number is int else "a number"
        raise ValueError(f"{opt.name} must be {kind}, got {value!r}") from None


def _declared() -> Mapping[str, Option]:
    hints = typing.get_type_hints(StylizeOptions)
    out = {}
    for f in dataclasses.fields(StylizeOptions):
        args = typing.get_args(hints[f.name])
        optional = typing.get_origin(hints[f.name]) in (typing.Union, types.UnionType)
        kind = next(a for a in args if a is not type(None)) if optional else hints[f.name]
        out[f.name] = dataclasses.replace(f.metadata["option"], name=f.name, type=kind, optional=optional,
                                          default=f.default)
    return MappingProxyType(out)


DECLARED: Mapping[str, Option] = _declared()  # name -> Option, in the declaration's order
IMAGE_ONLY = ("num_samples", "format")  # what a clip does not take (one mp4 out, one result per frame)


def offered(surface: str) -> list[Option]:
    """The options a surface offers (FORM, CLI, UI, PYTHON), in the declaration's order."""
    return [opt for opt in DECLARED.values() if opt.on(surface)]
