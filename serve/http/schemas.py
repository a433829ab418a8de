"""Request and response models of the HTTP API (they also make up /openapi.json)."""
from __future__ import annotations

from typing import Any, ClassVar, Union

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.json_schema import SkipJsonSchema

from stylevar.pipelines.options import FORM, Option, offered
from stylevar.pipelines.request import RequestError, StylizeRequest

FORM_OPTIONS = offered(FORM)
LIST_ENCODING = "; comma-separated or a JSON list"


class FormOptions(BaseModel):
    """What `StylizeForm` does beyond its fields (those are derived from `stylevar.pipelines.request`)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    OPTIONS: ClassVar[list[Option]] = FORM_OPTIONS  # the declaration's options this form has (a route's own subset)

    def request(self) -> StylizeRequest:
        """The form as a `StylizeRequest`, validated by the declaration; what it refuses is the 422 of a bad field."""
        try:
            return StylizeRequest.of(**{opt.name: getattr(self, opt.name) for opt in self.OPTIONS})
        except RequestError as e:
            raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors]) from None


def form_field(opt: Option) -> tuple[Any, Any]:
    """The form field of an option: a list option is text, parsed by the request; None (absent) is left out of
    the schema, as a form cannot send null. The form checks the service's own bounds (`Option.served_le`) and
    the types; the ranges are in its schema, and checked by the request."""
    kind = str if opt.is_list else opt.type
    limits: dict[str, Any] = {"max_length": opt.max_chars} if opt.is_list else {}
    names = ("ge", "le") if opt.optional else ("minimum", "maximum")  # as pydantic writes a constraint on each
    schema = {} if opt.is_list else {k: v for k, v in zip(names, (opt.ge, opt.le)) if v is not None}
    if opt.served_le is not None:
        limits["le"] = opt.served_le
        schema.pop(names[1], None)
    if opt.example:
        limits["examples"] = [opt.example]
    description = opt.describe("absent", LIST_ENCODING if opt.is_list else "")
    return (Union[kind, SkipJsonSchema[None]] if opt.optional else kind,
            Field(opt.default, description=description, json_schema_extra=schema or None, **limits))


StylizeForm = create_model(
    "StylizeForm", __base__=FormOptions, __module__=__name__,
    __doc__="Generation and output options of `POST /stylize` and `POST /stylize/stream` (form fields).",
    **{opt.name: form_field(opt) for opt in FORM_OPTIONS},
)


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
