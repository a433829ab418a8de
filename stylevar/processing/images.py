"""Images at the edges of the library: safe decoding, mode conversion, square fitting and back.

Inside the library images are float tensors (B, 3, H, W); PIL appears only here and in the surfaces.
"""
from __future__ import annotations

import io
import math
import os
import re
import struct
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from stylevar.processing import png_strips, signatures
from stylevar.processing.decode_bounds import MAX_SCANS, DecodeTimeout, TimedReader, file_scans
from stylevar.utils.errors import CodedError

if TYPE_CHECKING:  # torch is imported where tensors are made: decoding alone (the CLI's checks) stays light
    import torch

ResizeMode = Literal["crop", "pad", "stretch"]
RESIZE_MODES = ("crop", "pad", "stretch")
DEFAULT_MAX_PIXELS = 40_000_000  # pixels of a decoded image; a larger file is shrunk while decoding (decoded_size)
# the most pixels a file may have at all: Pillow's own decompression-bomb bound (2 x Image.MAX_IMAGE_PIXELS)
MAX_SOURCE_PIXELS = 178_956_970


class ImageError(CodedError, ValueError):
    """Base class for input images that cannot be used. `code` is a short machine-readable reason."""

    code = "bad_image"


class NotAnImageError(ImageError):
    code = "not_an_image"


class CorruptImageError(ImageError):
    code = "corrupt_image"


class ImageTooLargeError(ImageError):
    code = "image_too_large"


class ImageTooCostlyError(ImageError):
    """An image whose decoding would take more work than any ordinary file needs, or took longer than its time."""

    code = "image_too_costly"


@dataclass(frozen=True)
class Decoded:
    """An image as `decode_image` decoded it (8-bit RGB), with the size its file has (EXIF orientation applied)."""

    image: Image.Image
    size: tuple[int, int]
    shrink: int = 1  # over the pixel limit: each side was divided by this (2, 4, 8 ...) while decoding
    max_pixels: int | None = None  # the pixel limit it was decoded under

    def shrink_note(self, role: str) -> str | None:
        """The line saying how the `role` image was shrunk to fit the pixel limit; None when it was not."""
        if self.shrink == 1:
            return None
        (w, h), (dw, dh) = self.size, self.image.size
        return (f"the {role} image is {w}x{h} = {w * h} pixels, more than the limit of {self.max_pixels}: it was "
                f"shrunk {self.shrink}x while decoding, to {dw}x{dh}")


Picture = Image.Image | str | os.PathLike  # what the Python API takes as a picture (`as_image`)


def url_error(path: str | os.PathLike, what: str) -> str | None:
    """What to say when the "path" of ``what`` (a picture, a checkpoint) is a web address; None when it is not."""
    web = re.match(r"([A-Za-z][A-Za-z0-9+.-]+):/+(.*)", os.fspath(path))  # a Path has folded '//' into '/'
    return None if web is None else (f"{what} {web[1]}://{web[2]} is a web address: StyleVAR reads files only; "
                                     "download it first")


def as_image(value: Picture, role: str) -> Image.Image:
    """A picture handed to the Python API: a PIL image, or a path read by `load_image`; else a TypeError."""
    if isinstance(value, Image.Image):
        return value
    if isinstance(value, (str, os.PathLike)):
        if said := url_error(value, f"{role} image"):
            raise ValueError(said)
        return load_image(value)
    hint = " (an array: PIL.Image.fromarray(array))" if hasattr(value, "__array__") else ""
    raise TypeError(f"{role}: expected a PIL image or the path of one, not {type(value).__name__}{hint}")


def load_image(source: str | os.PathLike | bytes | Image.Image, **limits) -> Image.Image:
    """The image of `decode_image` (same arguments), without its size."""
    return decode_image(source, **limits).image


def decode_image(source: str | os.PathLike | bytes | Image.Image, *, max_pixels: int | None = DEFAULT_MAX_PIXELS,
                 formats: tuple[str, ...] | None = None, max_side: int | None = None,
                 max_whole_pixels: int | None = None, timeout_s: float | None = None) -> Decoded:
    """Decode an image to 8-bit RGB, EXIF orientation applied (an MPO: its primary picture). Every failure is an
    `ImageError` naming the file (a missing one stays `FileNotFoundError`); sizes are checked from the header first;
    `formats` (e.g. `ACCEPTED_FORMATS`) limits which decoders see the bytes.

    `max_side`: decoded downscaled to `capped_size` (JPEG by DCT scale, 8-bit PNG in strips; others whole, under
    `max_whole_pixels`). Over `max_pixels`: halved while decoding (`decoded_size`); never over `MAX_SOURCE_PIXELS`.
    Too many JPEG scans (refused unread) or a decode past `timeout_s`: `ImageTooCostlyError`."""
    limits = _Limits(max_pixels, formats, max_side, max_whole_pixels)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # MAX_SOURCE_PIXELS is checked here
            return _open_and_decode(source, limits, timeout_s)
    except (ImageError, FileNotFoundError):
        raise
    except DecodeTimeout as e:
        raise ImageTooCostlyError(f"{_where(source)}{e}") from e
    except UnidentifiedImageError as e:
        kind = signatures.accepted_kind(signatures.head(source), formats)
        if kind is not None:  # an accepted format's signature whose header Pillow refused (bad CRC, 0 x 0)
            raise CorruptImageError(f"{_where(source)}corrupt {kind} image (its header cannot be read)") from e
        raise NotAnImageError(_unrecognised(source, formats)) from e
    except Image.DecompressionBombError as e:  # Pillow's own bound, MAX_SOURCE_PIXELS
        raise ImageTooLargeError(f"{_where(source)}image has more than the limit of {MAX_SOURCE_PIXELS} pixels "
                                 f"({e})") from e
    except MemoryError as e:
        raise ImageTooLargeError(f"{_where(source)}image is too large to decode") from e
    except _DECODE_ERRORS as e:
        raise CorruptImageError(f"{_where(source)}corrupt or unreadable image ({type(e).__name__}: {e})") from e


def _open_and_decode(source: str | os.PathLike | bytes | Image.Image, limits: _Limits,
                     timeout_s: float | None) -> Decoded:
    if isinstance(source, Image.Image):
        return _decode(source, source, limits)
    img = _open(source, limits.formats, timeout_s)
    file = img.fp  # ours to close: Pillow lets go of it once loaded
    try:
        out = _decode(img, source, limits)
    finally:
        file.close()
    if out.image is not img:
        img.close()
    return out


@dataclass(frozen=True)
class _Limits:
    max_pixels: int | None
    formats: tuple[str, ...] | None
    max_side: int | None
    max_whole_pixels: int | None


def too_many_pixels(size: tuple[int, int], limit: int) -> str:
    """How an image over a surface's limit on a file's pixels is refused (the command line and the service alike)."""
    w, h = size
    return f"image is {w}x{h} = {w * h} pixels, more than the limit of {limit}"


# what the service and the command line accept from users (the same formats, the same messages)
ACCEPTED_FORMATS = ("JPEG", "PNG", "WEBP")
FORMAT_NAMES = {"JPEG": "JPEG", "PNG": "PNG", "WEBP": "WebP"}

# what Pillow's parsers and decoders raise on malformed data (besides OSError for truncation)
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, IndexError, KeyError, TypeError, ZeroDivisionError,
                  OverflowError, RecursionError, struct.error, zlib.error)
_STRIP_BYTES = 2 << 20  # rows decoded / reduced at a time when decoding downscaled
_JPEG_KINDS = ("JPEG", "MPO")  # an MPO is a JPEG with more pictures after the first (Pillow names it so)
# a PNG's decoder holds whole rows, so wider ones are refused; 1M pixels a row is 4 MB of RGBA
MAX_PNG_WIDTH = 1 << 20
_ORIENTATION = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
                5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
                8: Image.Transpose.ROTATE_90}


def _where(source: object) -> str:
    return "" if isinstance(source, (bytes, bytearray, Image.Image)) else f"{os.fspath(source)}: "


def _accepted(formats: tuple[str, ...] | None) -> str:
    return "" if formats is None else f" (accepted: {', '.join(FORMAT_NAMES.get(f, f) for f in formats)})"


def _open(source: str | os.PathLike | bytes, formats: tuple[str, ...] | None, timeout_s: float | None) -> Image.Image:
    """The image with its header parsed and no pixel decoded; with `timeout_s`, every read of the file checks it."""
    if isinstance(source, (bytes, bytearray)):
        fp = io.BytesIO(source)
    else:
        try:
            fp = open(os.fspath(source), "rb")  # noqa: SIM115 - the image owns the file from here on
        except FileNotFoundError:
            raise
        except OSError as e:
            raise CorruptImageError(f"{_where(source)}cannot read the file ({e.strerror or e})") from e
    try:
        return Image.open(fp if timeout_s is None else TimedReader(fp, timeout_s), formats=formats)
    except BaseException:
        fp.close()
        raise


def _unrecognised(source: str | os.PathLike | bytes, formats: tuple[str, ...] | None) -> str:
    kind = signatures.other_kind(signatures.head(source))
    if kind is not None and formats is not None:
        return f"{_where(source)}{kind} images are not accepted{_accepted(formats)}"
    return f"{_where(source)}not a recognised image{_accepted(formats)}"


def _decode(img: Image.Image, source: object, limits: _Limits) -> Decoded:
    streamable = png_strips.streamable(img)
    shrink = _check(img, source, limits, streamable)
    w, h = img.size
    target = decoded_size((w, h), limits.max_side, limits.max_pixels)
    orientation = _orientation(img)
    if target == (w, h):
        img.load()
        out = to_rgb(ImageOps.exif_transpose(img))
    else:
        method = _ORIENTATION.get(orientation)
        out = _downscaled(img, streamable, target)
        out = out.transpose(method) if method is not None else out
    return Decoded(out, (h, w) if orientation in (5, 6, 7, 8) else (w, h), shrink, limits.max_pixels)


def _downscaled(img: Image.Image, streamable: bool, target: tuple[int, int]) -> Image.Image:
    """`img` decoded at `target`: an 8-bit PNG strip by strip, a JPEG at the DCT scale just above it (1/2 .. 1/8),
    anything else whole; then box-reduced a strip at a time, unless the DCT scale gave the size itself."""
    if streamable:
        return _reduce_strips(png_strips.strips(img), img.size, target)
    if img.format in _JPEG_KINDS:
        scale = _dct_scale(img.size, target)  # 1, 2, 4 or 8: never smaller than the target
        img.draft(img.mode, (img.width // scale, img.height // scale))
    img.load()
    return to_rgb(img) if img.size == target else _reduce_strips(_bands(img), img.size, target)


def _check(img: Image.Image, source: object, limits: _Limits, streamable: bool) -> int:
    """Every refusal from the header (no pixel decoded); the factor the image is shrunk by to fit `max_pixels`."""
    formats, kind = limits.formats, "JPEG" if img.format in _JPEG_KINDS else img.format
    if formats is not None and kind not in formats:
        raise NotAnImageError(f"{_where(source)}{img.format} images are not accepted{_accepted(formats)}")
    w, h = img.size
    if w * h > MAX_SOURCE_PIXELS:
        raise ImageTooLargeError(f"{_where(source)}{too_many_pixels((w, h), MAX_SOURCE_PIXELS)}")
    if w == 0 or h == 0:
        raise CorruptImageError(f"{_where(source)}image has zero size")
    if kind == "PNG" and w > MAX_PNG_WIDTH:
        raise ImageTooLargeError(f"{_where(source)}image is {w} pixels wide, more than the limit of {MAX_PNG_WIDTH} "
                                 "for PNG images (a PNG is decoded a whole row at a time)")
    whole = not streamable and kind != "JPEG"  # decoded at full size whatever the size asked for
    shrink = shrink_factor((w, h), limits.max_pixels, limits.max_side)
    if shrink > 1 and whole:
        raise ImageTooLargeError(f"{_where(source)}{too_many_pixels((w, h), limits.max_pixels)} for {_kind(img)} "
                                 "images (only JPEG and 8-bit PNG images are shrunk while decoding)")
    if limits.max_whole_pixels is not None and w * h > limits.max_whole_pixels and whole:
        raise ImageTooLargeError(
            f"{_where(source)}image is {w}x{h} = {w * h} pixels, more than the limit of {limits.max_whole_pixels} for "
            f"{_kind(img)} images, which are decoded at full size (JPEG and 8-bit PNG images are decoded "
            "downscaled and may be larger)")
    if kind == "JPEG" and img.fp is not None and file_scans(img.fp) > MAX_SCANS:
        raise ImageTooCostlyError(f"{_where(source)}JPEG image has more than {MAX_SCANS} scans (a progressive JPEG "
                                  f"has about 10; decoding time grows with each)")
    return shrink


def shrink_factor(size: tuple[int, int], max_pixels: int | None, max_side: int | None = None) -> int:
    """1, or how many times smaller (2, 4, 8 ...) each side of an image of `size` is decoded so that, its long side
    then capped at `max_side`, it has at most `max_pixels` (sides rounded up)."""
    factor = 1
    while max_pixels is not None and factor < max(size) and math.prod(_at(size, factor, max_side)) > max_pixels:
        factor *= 2
    return factor


def decoded_size(size: tuple[int, int], max_side: int | None = None,
                 max_pixels: int | None = DEFAULT_MAX_PIXELS) -> tuple[int, int]:
    """The (w, h) `decode_image` gives an image of `size`: capped at `max_side`, then halved to fit `max_pixels`."""
    return _at(size, shrink_factor(size, max_pixels, max_side), max_side)


def _at(size: tuple[int, int], factor: int, max_side: int | None) -> tuple[int, int]:
    halved = (-(-size[0] // factor), -(-size[1] // factor))
    return halved if max_side is None else capped_size(halved, max_side)


def _dct_scale(size: tuple[int, int], target: tuple[int, int]) -> int:
    """The largest JPEG DCT scale (1, 2, 4, 8) whose decode (sides rounded up) is nowhere smaller than `target`."""
    most = min(_most_reduction(n, t) for n, t in zip(size, target))
    return next(s for s in (8, 4, 2, 1) if s <= most)


def _most_reduction(n: int, t: int) -> int:
    """The largest whole factor f with ceil(n / f) >= t: a reduction by f keeps at least t of n pixels."""
    return n if t <= 1 else max(1, (n - 1) // (t - 1))


def _kind(img: Image.Image) -> str:
    if img.format == "PNG":
        return "interlaced PNG" if img.info.get("interlace") else "16-bit or sub-byte PNG"
    return FORMAT_NAMES.get(img.format or "", img.format or "such")


def _orientation(img: Image.Image) -> int:
    """EXIF orientation from metadata parsed with the header (never decodes pixels)."""
    if "exif" not in img.info:
        return 1
    value = img.getexif().get(0x0112, 1)
    return value if isinstance(value, int) else 1


def scaled_size(size: tuple[int, int], long_side: int) -> tuple[int, int]:
    """(w, h) scaled so the long side is `long_side`, keeping the aspect ratio (smaller or larger)."""
    w, h = size
    s = long_side / max(w, h)
    return max(1, round(w * s)), max(1, round(h * s))


def capped_size(size: tuple[int, int], max_side: int) -> tuple[int, int]:
    """(w, h) scaled so the long side is at most `max_side`, keeping the aspect ratio (never enlarged)."""
    return size if max(size) <= max_side else scaled_size(size, max_side)


def _strip_rows(width: int, factor: int) -> int:
    """Rows per strip: about `_STRIP_BYTES` of RGBA, a multiple of the reduction factor."""
    rows = max(1, _STRIP_BYTES // (4 * width))
    return max(factor, rows // factor * factor)


def _reduce_strips(strips: Callable[[int], Iterator[Image.Image]], size: tuple[int, int],
                   target: tuple[int, int]) -> Image.Image:
    """Strips (top to bottom, full width) -> RGB at `target`, each box-reduced as it comes."""
    w, h = size
    # per axis (a 1 x 40M image reduces its long side), as much as keeps at least the target
    fx, fy = _most_reduction(w, target[0]), _most_reduction(h, target[1])
    canvas = Image.new("RGB", (-(-w // fx), -(-h // fy)))
    y = 0
    for strip in strips(_strip_rows(w, fy)):
        rgb = to_rgb(strip)
        small = rgb.reduce((fx, fy)) if fx > 1 or fy > 1 else rgb
        canvas.paste(small, (0, y // fy))
        y += strip.height
    if y != h:
        raise OSError(f"image data ends after {y} of {h} rows")
    return canvas if canvas.size == target else canvas.resize(target, Image.BICUBIC)


def _bands(img: Image.Image) -> Callable[[int], Iterator[Image.Image]]:
    """A loaded image as strips of rows (16-bit and float images keep one scale for all strips)."""
    hi = _int_scale(img) if img.mode in _INT_MODES else None

    def strips(rows: int) -> Iterator[Image.Image]:
        for top in range(0, img.height, rows):
            band = img.crop((0, top, img.width, min(img.height, top + rows)))
            yield band if hi is None else _int_to_l(band, hi)
    return strips


_INT_MODES = ("I;16", "I;16B", "I;16L", "I", "F")


def _int_scale(img: Image.Image) -> float:
    """The white level of a 16-bit, 32-bit or float image: 65535 when 16-bit or brighter than 255, else 255."""
    return 65535.0 if img.mode.startswith("I;16") or img.getextrema()[1] > 255 else 255.0


def _int_to_l(img: Image.Image, hi: float) -> Image.Image:
    arr = np.asarray(img, dtype=np.float64)
    return Image.fromarray(np.clip(arr / hi * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode to 8-bit RGB; transparency is composited on white."""
    if img.mode in _INT_MODES:
        img = _int_to_l(img, _int_scale(img))
    if img.mode == "P":
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA"):
        rgba = img.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(bg, rgba).convert("RGB")
    return img.convert("RGB") if img.mode != "RGB" else img


# a content image shrunk to the model's square is first box-reduced by whole factors to within 3x of it, then resized
REDUCING_GAP = 3.0


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
        return img.resize((side, side), Image.BICUBIC, reducing_gap=REDUCING_GAP), fit
    if mode == "crop":
        return ImageOps.fit(img, (side, side), Image.BICUBIC), fit
    left, top, right, bottom = fit.box
    inner = img.resize((right - left, bottom - top), Image.BICUBIC, reducing_gap=REDUCING_GAP)
    mean = tuple(int(c) for c in np.asarray(inner).reshape(-1, 3).mean(0))
    canvas = Image.new("RGB", (side, side), mean)
    canvas.paste(inner, (left, top))
    return canvas, fit


def unfit(img: Image.Image, fit: Fit, max_side: int | None = None) -> Image.Image:
    """Map a square result back to the original size, its long side capped at `max_side` (`pad` and `stretch`:
    the original aspect ratio; `crop`: the centre square it generated)."""
    if fit.mode == "pad":
        img = img.crop(fit.box)
    return img.resize(result_size(fit, max_side), Image.BICUBIC)


def result_size(fit: Fit, max_side: int | None = None) -> tuple[int, int]:
    """The (w, h) `unfit` returns: the original size (for `crop`, the centre square) capped at `max_side`."""
    if fit.mode == "crop":
        side = min(fit.size) if max_side is None else min(*fit.size, max_side)
        return side, side
    return fit.size if max_side is None else capped_size(fit.size, max_side)


def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """RGB PIL -> (3, H, W) float32 in [0, 1]."""
    import torch
    arr = np.asarray(to_rgb(img), dtype=np.uint8).copy()
    return torch.from_numpy(arr).permute(2, 0, 1).float().div_(255.0)


def to_levels(x: torch.Tensor) -> torch.Tensor:
    """Float in [0, 1] -> the whole levels 0..255 an 8-bit picture holds (still float)."""
    return x.detach().float().clamp(0, 1).mul(255).round()


def tensor_to_pil(x: torch.Tensor) -> Image.Image:
    """(3, H, W) float in [0, 1] -> RGB PIL."""
    import torch
    return Image.fromarray(to_levels(x).to(torch.uint8).permute(1, 2, 0).cpu().numpy(), "RGB")
