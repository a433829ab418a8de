"""What is done to a request around the model call, once for every entry point: the seeds of several samples, the
output size limit and colour preservation.
"""
from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from PIL import Image, ImageOps

MAX_SEED = 2**32 - 1  # seeds are 32-bit (the service's form field and the command line's --seed)
# how a drawing reaches the result's size (stylevar.processing.upsample); declared here, where no torch is needed
UpsampleMode = Literal["guided", "bicubic"]
UPSAMPLE_MODES: tuple[str, ...] = ("guided", "bicubic")
DEFAULT_UPSAMPLE: UpsampleMode = "guided"
MAX_STYLES = 4  # style images per request (a blend): each adds a query stream to every attention call


@dataclass(frozen=True)
class OutputOptions:
    """How a stylized image is finished: ``max_side`` (None: the content's size) and ``preserve_color``."""

    max_side: int | None = None
    preserve_color: bool = False

    def __post_init__(self) -> None:
        if self.max_side is not None and self.max_side < 1:
            raise ValueError(f"max_side must be >= 1, got {self.max_side}")


def check_style_weights(weights: Sequence[float]) -> tuple[float, ...]:
    """Style weights as floats, each finite and >= 0 in float32, with a finite sum > 0: one rule for every surface."""
    values = tuple(float(w) for w in weights)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        w32 = np.asarray(values, dtype=np.float32)
        total = w32.sum(dtype=np.float32)
    if not values or not np.isfinite(w32).all() or (w32 < 0).any() or not (np.isfinite(total) and total > 0):
        raise ValueError("style weights must be finite numbers >= 0 (in float32, the model's precision: at most "
                         "about 3.4e38), not all 0 (nor all below about 1e-45)")
    return values


def sample_seeds(seed: int | None, num_samples: int) -> list[int]:
    """``seed, seed + 1, ...`` for ``num_samples``; without a seed the first comes from torch's global generator."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if seed is None:
        import torch

        seed = int(torch.randint(0, MAX_SEED + 1, (1,)).item())
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be in [0, {MAX_SEED}], got {seed}")
    return [seed + i for i in range(num_samples)]


def os_random_seed() -> int:
    """A seed from the OS's randomness, for a service request without one (replicas must not repeat each other)."""
    return secrets.randbelow(MAX_SEED + 1)


def preserve_color(result: Image.Image, content: Image.Image) -> Image.Image:
    """The result's luminance (Y of YCbCr) with the content's chroma (Cb, Cr), resampled onto the result's frame."""
    content = ImageOps.fit(content.convert("RGB"), result.size, Image.BICUBIC)
    y, _, _ = result.convert("YCbCr").split()
    _, cb, cr = content.convert("YCbCr").split()
    return Image.merge("YCbCr", (y, cb, cr)).convert("RGB")


def finish(images: Sequence[Image.Image], content: Image.Image, options: OutputOptions) -> list[Image.Image]:
    """The model's results for one content image, finished as ``options`` ask."""
    if options.preserve_color:
        return [preserve_color(im, content) for im in images]
    return list(images)


def upscale_factor(result_size: tuple[int, int], model_side: int) -> float:
    """How much larger than the model's own resolution a result is (1.0 or less: not upscaled)."""
    return max(result_size) / model_side


def size_cap(size: tuple[int, int], result_size: tuple[int, int], max_side: int | None) -> str | None:
    """``20000x1000->8192x410``: a content of ``size`` whose long side ``max_side`` capped, and the result's size;
    None when nothing was capped (the service's `X-Size-Capped`)."""
    if max_side is None or max(size) <= max_side:
        return None
    return f"{size[0]}x{size[1]}->{result_size[0]}x{result_size[1]}"


def size_cap_note(cap: str, max_side: int, setting: str) -> str:
    """The line that says a size was capped (``cap``: `size_cap`'s), and by which ``setting``."""
    return f"note: the result's long side is capped at {max_side} pixels ({setting}): {cap}"
