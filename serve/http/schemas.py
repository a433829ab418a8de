"""Request and response models of the HTTP API (they also make up /openapi.json)."""
from __future__ import annotations

from typing import Any, ClassVar, Literal, Union

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.json_schema import SkipJsonSchema

from stylevar.loaders.preflight import SMALL_SIDE
from stylevar.pipelines.options import FORM, Option, offered
from stylevar.pipelines.request import RequestError, StylizeRequest
from stylevar.processing.postprocess import MAX_SEED

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
    """The form field of an option: a list option is text, parsed by the request; None (absent) is left out of the
    schema. The form checks the types and `Option.served_le`; the request checks the ranges in the schema."""
    kind = str if opt.is_list else opt.type
    limits: dict[str, Any] = {"max_length": opt.max_chars} if opt.is_list else {}
    schema = {} if opt.is_list else {k: v for k, v in (("minimum", opt.ge), ("maximum", opt.le)) if v is not None}
    if opt.served_le is not None:
        limits["le"] = opt.served_le
        schema.pop("maximum", None)
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
    precision: Literal["fp32", "bf16"] = Field(
        description="what the model runs in: fp32 (its own weights) or bf16; STYLEVAR_PRECISION=auto settles on one "
                    "when the model loads")
    precision_reason: str = Field(description="why that precision: asked for, or what auto measured on this machine")
    image_size: int
    patch_nums: list[int]
    default_alphas: list[float]
    vocab_size: int
    config: dict[str, Any]


TEXT, NUMBER = {"type": "string"}, {"type": "number"}
HEADERS: dict[str, tuple[str, dict[str, Any]]] = {  # every header the service's answers carry: (description, schema)
    "X-Request-ID": ("the request's id: the client's own X-Request-ID, else one made; in the access log", TEXT),
    "Retry-After": ("seconds to wait before trying again", {"type": "integer", "minimum": 0}),
    "X-Seed": ("seed of the first sample (sample i used seed + i); it gives the same picture again on the same kind of "
               "device in the same precision, not on another (a GPU's seed on the CPU: docs/gpus.md)",
               {"type": "integer", "minimum": 0, "maximum": MAX_SEED}),
    "X-Inference-Ms": ("time the model took, in milliseconds", NUMBER),
    "X-Model": ("the model's name", TEXT),
    "X-Model-Size": ("side of the square the model draws, in pixels", {"type": "integer", "minimum": 1}),
    "X-Upscale": ("the result's long side over X-Model-Size (1 or less: not upscaled)", NUMBER),
    "X-Upsample": ("how the drawing reached the result's size", {"type": "string", "enum": ["guided", "bicubic"]}),
    "X-Content-Shrunk": ("only when the content was over the pixel limit and shrunk while decoding: by how much",
                         TEXT),
    "X-Size-Capped": ("only when the content's long side was over the service's STYLEVAR_MAX_OUTPUT_SIDE: the "
                      "content's size and the result's, WxH->wxh", {"type": "string", "pattern": r"^\d+x\d+->\d+x\d+$"}),
    "X-StyleVAR-Warning": (f"only when the content or a style image is under {SMALL_SIDE}x{SMALL_SIDE} pixels (too "
                           "small to carry much): what the command line warns, the images and their sizes", TEXT),
    "Vary": ("Accept: the answer depends on the Accept header", TEXT),
    "Content-Disposition": ("several samples: the zip's file name", TEXT),
    "Cache-Control": ("no-cache: the events are not stored", TEXT),
    "X-Accel-Buffering": ("no: a proxy passes each event on as it comes", TEXT),
    "X-Frames": ("frames in the clip", {"type": "integer", "minimum": 0}),
    "X-Fps": ("the clip's frame rate", NUMBER),
    "X-Temporal": ("how the frames were kept consistent (the `temporal` field)", TEXT),
    "X-Audio": ("1: the source's audio is kept; 0: the source had none", {"type": "string", "enum": ["0", "1"]}),
}


def response_headers(*names: str, optional: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """The OpenAPI `headers` of an answer that carries `names` (always) and `optional` (sometimes), from `HEADERS`;
    a route declares them in its `responses` (a header missing from `HEADERS` is a KeyError)."""
    return {name: {"description": HEADERS[name][0], "required": name not in optional, "schema": HEADERS[name][1]}
            for name in (*names, *optional)}
