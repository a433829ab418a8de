"""Request and response models of the HTTP API (they also make up /openapi.json)."""
from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic.json_schema import SkipJsonSchema

from stylevar.generation import DEFAULT_GENERATION
from stylevar.pipeline import MAX_STYLES
from stylevar.postprocess import MAX_SEED, UPSAMPLE_MODES, check_style_weights

MAX_ALPHAS_CHARS = 4096  # far more than any model's scale count needs
MAX_WEIGHTS_CHARS = 256  # MAX_STYLES numbers
MAX_GUIDANCE = 10.0  # far past where pictures stop looking like anything


class StylizeForm(BaseModel):
    """Generation and output options of `POST /stylize` and `POST /stylize/stream` (form fields)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    style_strength: float = Field(0.0, ge=-1.0, le=1.0, description="-1 keeps more content, 1 more style")
    # `None` is the absent field; a form cannot send null, so the schema leaves it out
    seed: int | SkipJsonSchema[None] = Field(
        None, ge=0, le=MAX_SEED, description="random when absent; sample i uses seed + i"
    )
    top_k: int | SkipJsonSchema[None] = Field(
        None, ge=0, le=1_000_000,
        description=f"0 switches top-k off; absent: the model's recommended value (else {DEFAULT_GENERATION.top_k})",
    )
    top_p: float | SkipJsonSchema[None] = Field(
        None, ge=0.0, le=1.0,
        description=f"0 or 1 switches nucleus sampling off; absent: the model's value "
                    f"(else {DEFAULT_GENERATION.top_p})",
    )
    num_samples: int = Field(1, ge=1, le=4)
    alphas: str | SkipJsonSchema[None] = Field(
        None, max_length=MAX_ALPHAS_CHARS,
        description="per-scale blend coefficients in [0, 1], one per scale: comma-separated or a JSON list",
        examples=["0.2,0.3,0.4,0.5,0.6,0.7"],
    )
    resize: Literal["crop", "pad", "stretch"] = Field(
        "stretch", description="how the inputs are fitted into the model's square; crop returns the centre square"
    )
    preserve_color: bool = Field(False, description="keep the content's colours, transfer the texture")
    upsample: Literal["guided", "bicubic"] | SkipJsonSchema[None] = Field(
        None, description=f"how the model's drawing reaches the result's size ({' or '.join(UPSAMPLE_MODES)}): "
                          "guided adds the content's fine detail where the drawing follows the content, bicubic "
                          "only resizes; absent: the model's setting (guided unless its config.json says otherwise)",
    )
    format: Literal["png", "jpeg", "webp"] = "png"
    style_weights: str | SkipJsonSchema[None] = Field(
        None, max_length=MAX_WEIGHTS_CHARS,
        description=f"one weight >= 0 per `style` file, in their order (not all 0; normalised to sum to 1): "
                    f"comma-separated or a JSON list; absent: equal. At most {MAX_STYLES} styles.",
        examples=["0.7,0.3"],
    )
    guidance: float = Field(
        0.0, ge=0.0, le=MAX_GUIDANCE,
        description="push the result away from what the model draws without the style (the content as its "
                    "own style): 0 = off; larger = more style, less content",
    )

    @field_validator("alphas", "style_weights")
    @classmethod
    def _numbers_parse(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A blank list is none; any other must parse (`alpha_values`, `weight_values`)."""
        if value is None or not value.strip():
            return None
        (parse_alphas if info.field_name == "alphas" else parse_weights)(value)
        return value

    def alpha_values(self) -> tuple[float, ...] | None:
        return None if self.alphas is None else parse_alphas(self.alphas)

    def weight_values(self) -> tuple[float, ...] | None:
        return None if self.style_weights is None else parse_weights(self.style_weights)


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


def parse_weights(text: str) -> tuple[float, ...]:
    """Style weights: 1 to MAX_STYLES numbers >= 0, not all 0."""
    values = parse_numbers(text, "style_weights")
    if len(values) > MAX_STYLES:
        raise ValueError(f"at most {MAX_STYLES} style weights, got {len(values)}")
    return check_style_weights(values)


def parse_alphas(text: str) -> tuple[float, ...]:
    """`0.2,0.3` or `[0.2, 0.3]` -> floats in [0, 1]; anything else (deeply nested JSON included) is a ValueError."""
    values = parse_numbers(text, "alphas")
    if not all(0.0 <= v <= 1.0 for v in values):
        raise ValueError("every alpha must lie in [0, 1]")
    return values


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
