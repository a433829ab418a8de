"""Images at the edges of the library: safe decoding, mode conversion, square fitting and back.

Inside the library images are float tensors (B, 3, H, W); PIL appears only here, in the pipeline,
the service, the UI and the tools.
"""
from __future__ import annotations

import io
import os
import struct
import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

ResizeMode = Literal["crop", "pad", "stretch"]
RESIZE_MODES = ("crop", "pad", "stretch")
DEFAULT_MAX_PIXELS = 40_000_000


class ImageError(ValueError):
    """Base class for input images that cannot be used. `code` is a short machine-readable reason."""

    code = "bad_image"


class NotAnImageError(ImageError):
    code = "not_an_image"


class CorruptImageError(ImageError):
    code = "corrupt_image"


class ImageTooLargeError(ImageError):
    code = "image_too_large"


def load_image(
    source: str | os.PathLike | bytes | Image.Image,
    *,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    formats: tuple[str, ...] | None = None,
) -> Image.Image:
    """Decode an image to 8-bit RGB, applying EXIF orientation.

    The pixel count is checked from the header before any pixel is decoded (decompression bombs);
    grayscale, palette, alpha (composited on white), CMYK and 16-bit images are converted.
    """
    if isinstance(source, Image.Image):
        img = source
    else:
        data = source if isinstance(source, (bytes, bytearray)) else None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                # `formats` limits which decoders ever see the bytes (untrusted input)
                img = Image.open(io.BytesIO(data) if data is not None else os.fspath(source), formats=formats)
        except FileNotFoundError:
            raise
        except UnidentifiedImageError as e:
            accepted = f" (accepted: {', '.join(formats)})" if formats is not None else ""
            raise NotAnImageError(f"not a recognised image: {_name(source)}{accepted}") from e
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            raise ImageTooLargeError(f"image has too many pixels: {_name(source)}") from e
        except OSError as e:
            raise CorruptImageError(f"cannot read image {_name(source)}: {e}") from e
        if formats is not None and img.format not in formats:
            raise NotAnImageError(f"image format {img.format} is not accepted (accepted: {', '.join(formats)})")
    w, h = img.size
    if max_pixels is not None and w * h > max_pixels:
        raise ImageTooLargeError(f"image is {w}x{h} = {w * h} pixels, more than the limit of {max_pixels}")
    if w == 0 or h == 0:
        raise CorruptImageError("image has zero size")
    try:
        img.load()
        img = ImageOps.exif_transpose(img)
        return to_rgb(img)
    except _DECODE_ERRORS as e:
        raise CorruptImageError(f"cannot decode image {_name(source)}: {e}") from e


# what Pillow's decoders raise on malformed data (besides OSError for truncation)
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, IndexError, KeyError, TypeError, ZeroDivisionError,
                  struct.error)


def _name(source) -> str:
    return "<bytes>" if isinstance(source, (bytes, bytearray)) else str(source)


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode to 8-bit RGB; transparency is composited on white."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        arr = np.asarray(img, dtype=np.float64)
        hi = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
        img = Image.fromarray(np.clip(arr / hi * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")
    if img.mode == "P":
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA"):
        rgba = img.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(bg, rgba).convert("RGB")
    return img.convert("RGB") if img.mode != "RGB" else img


@dataclass(frozen=True)
class Fit:
    """How an image was fitted into a square, so the result can be mapped back."""

    mode: str
    size: tuple[int, int]  # original (w, h)
    box: tuple[int, int, int, int]  # region of the square that holds picture content (l, t, r, b)


def fit_of(size: tuple[int, int], side: int, mode: ResizeMode = "crop") -> Fit:
    """Where an image of `size` (w, h) lands in side x side under `mode` (see :func:`fit_square`)."""
    if mode not in RESIZE_MODES:
        raise ValueError(f"resize mode must be one of {RESIZE_MODES}, not {mode!r}")
    w, h = size
    if mode in ("stretch", "crop"):
        return Fit(mode, (w, h), (0, 0, side, side))
    scale = side / max(w, h)
    nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
    left, top = (side - nw) // 2, (side - nh) // 2
    return Fit(mode, (w, h), (left, top, left + nw, top + nh))


def fit_square(img: Image.Image, side: int, mode: ResizeMode = "crop") -> tuple[Image.Image, Fit]:
    """Fit an RGB image into side x side: centre `crop`, `pad` (letterbox, edge colour) or `stretch`."""
    fit = fit_of(img.size, side, mode)
    if mode == "stretch":
        return img.resize((side, side), Image.BICUBIC), fit
    if mode == "crop":
        return ImageOps.fit(img, (side, side), Image.BICUBIC), fit
    left, top, right, bottom = fit.box
    inner = img.resize((right - left, bottom - top), Image.BICUBIC)
    mean = tuple(int(c) for c in np.asarray(inner).reshape(-1, 3).mean(0))
    canvas = Image.new("RGB", (side, side), mean)
    canvas.paste(inner, (left, top))
    return canvas, fit


def unfit(img: Image.Image, fit: Fit, max_side: int | None = None) -> Image.Image:
    """Map a square result back to the original size (capped at `max_side`).

    `pad` and `stretch` give the original aspect ratio; `crop` gives the centre square it generated.
    """
    w, h = fit.size
    if max_side is not None and max(w, h) > max_side:
        s = max_side / max(w, h)
        w, h = max(1, round(w * s)), max(1, round(h * s))
    if fit.mode == "pad":
        img = img.crop(fit.box)
    elif fit.mode == "crop":
        # only the centre square was generated: the result is that square, at the short side's size
        w = h = min(w, h)
    return img.resize((w, h), Image.BICUBIC)


def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """RGB PIL -> (3, H, W) float32 in [0, 1]."""
    arr = np.asarray(to_rgb(img), dtype=np.uint8).copy()
    return torch.from_numpy(arr).permute(2, 0, 1).float().div_(255.0)


def tensor_to_pil(x: torch.Tensor) -> Image.Image:
    """(3, H, W) float in [0, 1] -> RGB PIL."""
    arr = x.detach().float().clamp(0, 1).mul(255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    return Image.fromarray(arr, "RGB")
