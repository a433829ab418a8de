"""Request and response models of the HTTP API (they also make up /openapi.json)."""
from __future__ import annotations

import json
import math
from typing import Any, ClassVar, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, create_model, field_validator
from pydantic.json_schema import SkipJsonSchema

from stylevar.pipelines.options import FORM, Option, StylizeOptions, offered

FORM_OPTIONS = offered(FORM)
FORM_LIST = {opt.name: opt for opt in FORM_OPTIONS if opt.is_list}  # given as text, parsed by `parse_list`
LIST_ENCODING = "; comma-separated or a JSON list"


class FormOptions(BaseModel):
    """What `StylizeForm` does beyond its fields (those are derived from `stylevar.pipelines.options`)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    OPTIONS: ClassVar[list[Option]] = FORM_OPTIONS  # the declaration's options this form has (a route's own subset)

    def options(self) -> StylizeOptions:
        """The form as the declaration's values (list options parsed)."""
        values = {opt.name: getattr(self, opt.name) for opt in self.OPTIONS}
        values.update({opt.name: parse_list(opt.name, values[opt.name]) for opt in self.OPTIONS
                       if opt.is_list and values[opt.name] is not None})
        return StylizeOptions.of(values)

    def alpha_values(self) -> tuple[float, ...] | None:
        """The per-scale alphas as numbers (None: the model's own)."""
        return self.options().alphas


def blank_or_parsed(cls, value: str | None, info: ValidationInfo) -> str | None:
    """A blank list is none; any other must parse (`parse_list`)."""
    if value is None or not value.strip():
        return None
    parse_list(info.field_name, value)
    return value


def form_field(opt: Option) -> tuple[Any, Any]:
    """The form field of an option: a list option is text; None (absent) is left out of the schema, as a form
    cannot send null."""
    kind = str if opt.is_list else opt.type
    limits = {"max_length": opt.max_chars} if opt.is_list else {
        k: v for k, v in (("ge", opt.ge), ("le", opt.le)) if v is not None}
    if opt.example:
        limits["examples"] = [opt.example]
    description = opt.describe("absent", LIST_ENCODING if opt.is_list else "")
    return (Union[kind, SkipJsonSchema[None]] if opt.optional else kind,
            Field(opt.default, description=description, **limits))


StylizeForm = create_model(
    "StylizeForm", __base__=FormOptions, __module__=__name__,
    __doc__="Generation and output options of `POST /stylize` and `POST /stylize/stream` (form fields).",
    __validators__={"lists_parse": field_validator(*FORM_LIST)(blank_or_parsed)},
    **{opt.name: form_field(opt) for opt in FORM_OPTIONS},
)


def parse_numbers(text: str, what: str) -> tuple[float, ...]:
    """`0.2,0.3` or `[0.2, 0.3]` -> finite floats; anything else (deeply nested JSON included) is a ValueError."""
    text = text.strip()
    try:
        raw: Any = json.loads(text) if text.startswith("[") else [p for p in text.split(",")]
        if not isinstance(raw, list) or not raw:
            raise ValueError
        values = tuple(float(v) for v in raw)
    except (ValueError, TypeError, RecursionError):
        raise ValueError(f"{what} must be numbers separated by commas, or a JSON list of numbers") from None
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"every one of the {what} must be a finite number")
    return values


def parse_list(name: str, text: str) -> tuple[float, ...]:
    """A list option's form text -> its values, checked by the declaration (`Option.check`)."""
    return FORM_LIST[name].check(parse_numbers(text, name))


def parse_alphas(text: str) -> tuple[float, ...]:
    """`0.2,0.3` or `[0.2, 0.3]` -> floats in [0, 1]; anything else (deeply nested JSON included) is a ValueError."""
    return parse_list("alphas", text)


class ErrorBody(BaseModel):
    error: str = Field(description="short machine-readable code")
    detail: str = Field(description="what went wrong, for people")


class ImageOut(BaseModel):
    seed: int
    media_type: str
    width: int
    height: int
    data: str = Field(description="base64 of the encoded image")
    upscale: float = Field(description="the image's long side over the model's drawing size (1 or less: not upscaled)")


class StylizeResult(BaseModel):
    model: str
    seed: int = Field(description="seed of the first sample")
    inference_ms: float
    model_size: int = Field(description="side of the square the model draws, in pixels")
    upsample: str = Field(description="how the drawing reached each image's size: guided or bicubic")
    images: list[ImageOut]


class Health(BaseModel):
    status: str


class ModelInfo(BaseModel):
    name: str
    demo: bool
    version: str = Field(description="stylevar package version")
    devices: list[str]
    dtype: str
    image_size: int
    patch_nums: list[int]
    default_alphas: list[float]
    vocab_size: int
    config: dict[str, Any]
