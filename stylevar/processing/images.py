"""Images at the edges of the library: safe decoding, mode conversion, square fitting and back.

Inside the library images are float tensors (B, 3, H, W); PIL appears only here, in the pipeline,
the service, the UI and the tools.

8-bit PNG is decoded here strip by strip (`_png_strips`), not by pyvips: the measurement behind that choice is in
benchmarks/README.md, "Decoding large uploads".
"""
from __future__ import annotations

import io
import os
import struct
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from stylevar.utils.errors import CodedError

if TYPE_CHECKING:  # torch is imported where tensors are made: decoding alone (the CLI's checks) stays light
    import torch

ResizeMode = Literal["crop", "pad", "stretch"]
RESIZE_MODES = ("crop", "pad", "stretch")
DEFAULT_MAX_PIXELS = 40_000_000


class ImageError(CodedError, ValueError):
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
    max_side: int | None = None,
    max_whole_pixels: int | None = None,
) -> Image.Image:
    """Decode an image to 8-bit RGB, applying EXIF orientation. Every way it can fail is an `ImageError`
    (a missing file stays `FileNotFoundError`), whose message names the file (not raw bytes).

    The pixel count is checked from the header before any pixel is decoded (decompression bombs), and
    `formats` (e.g. `ACCEPTED_FORMATS`) limits which decoders ever see the bytes. Grayscale, palette,
    alpha (composited on white), CMYK and 16-bit images are converted.

    `max_side` decodes downscaled: the result's long side is at most `max_side`, at the size `unfit`
    gives (`capped_size`). JPEG decodes at a reduced DCT scale and 8-bit PNG one strip of rows at a
    time, so neither exists at full size in memory; other images (WebP, 16-bit or interlaced PNG) can
    only be decoded whole (WebP needs about 16 bytes per pixel while it decodes), so `max_whole_pixels`
    gives them a lower pixel limit of their own.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = source if isinstance(source, Image.Image) else _open(source, formats)
            out = _decode(img, source, max_pixels=max_pixels, formats=formats, max_side=max_side,
                          max_whole_pixels=max_whole_pixels)
            if out is not img and img is not source:
                img.close()
            return out
    except (ImageError, FileNotFoundError):
        raise
    except UnidentifiedImageError as e:
        kind = _accepted_kind(source, formats)
        if kind is not None:  # an accepted format's signature whose header Pillow refused (bad CRC, 0 x 0)
            raise CorruptImageError(f"{_where(source)}corrupt {kind} image (its header cannot be read)") from e
        raise NotAnImageError(_unrecognised(source, formats)) from e
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageTooLargeError(f"{_where(source)}image has too many pixels ({e})") from e
    except MemoryError as e:
        raise ImageTooLargeError(f"{_where(source)}image is too large to decode") from e
    except _DECODE_ERRORS as e:
        raise CorruptImageError(f"{_where(source)}corrupt or unreadable image ({type(e).__name__}: {e})") from e


# what the service and the command line accept from users (the same formats, the same messages)
ACCEPTED_FORMATS = ("JPEG", "PNG", "WEBP")
FORMAT_NAMES = {"JPEG": "JPEG", "PNG": "PNG", "WEBP": "WebP"}

# what Pillow's parsers and decoders raise on malformed data (besides OSError for truncation): a PNG
# text chunk over Pillow's limit is a ValueError, deep EXIF/XMP structures a RecursionError
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, IndexError, KeyError, TypeError, ZeroDivisionError,
                  OverflowError, RecursionError, struct.error, zlib.error)
# a few formats a user may try, recognised from their first bytes for a clearer refusal
_SIGNATURES = ((b"GIF87a", "GIF"), (b"GIF89a", "GIF"), (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"),
               (b"8BPS", "PSD"), (b"%PDF", "PDF"))
_ISO_BRANDS = {b"heic": "HEIC", b"heix": "HEIC", b"mif1": "HEIF", b"avif": "AVIF"}
_STRIP_BYTES = 2 << 20  # rows decoded / reduced at a time when decoding downscaled
# a PNG's decoder holds whole rows: a 40M x 1 image would hold 160 MB for its one row (1.2 GB measured while
# decoding), so wider ones are refused; 1M pixels a row is 4 MB of RGBA, far wider than any photograph
MAX_PNG_WIDTH = 1 << 20
_ORIENTATION = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
                5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
                8: Image.Transpose.ROTATE_90}


def _where(source: object) -> str:
    return "" if isinstance(source, (bytes, bytearray, Image.Image)) else f"{os.fspath(source)}: "


def _accepted(formats: tuple[str, ...] | None) -> str:
    return "" if formats is None else f" (accepted: {', '.join(FORMAT_NAMES.get(f, f) for f in formats)})"


def _open(source: str | os.PathLike | bytes, formats: tuple[str, ...] | None) -> Image.Image:
    """The image with its header parsed and no pixel decoded."""
    if isinstance(source, (bytes, bytearray)):
        return Image.open(io.BytesIO(source), formats=formats)
    try:
        fp = open(os.fspath(source), "rb")  # noqa: SIM115 - the image owns the file from here on
    except FileNotFoundError:
        raise
    except OSError as e:
        raise CorruptImageError(f"{_where(source)}cannot read the file ({e.strerror or e})") from e
    try:
        return Image.open(fp, formats=formats)
    except BaseException:
        fp.close()
        raise


def _unrecognised(source: str | os.PathLike | bytes, formats: tuple[str, ...] | None) -> str:
    head = bytes(source[:16]) if isinstance(source, (bytes, bytearray)) else _head(source)
    kind = next((name for magic, name in _SIGNATURES if head.startswith(magic)), None)
    if kind is None and head[4:8] == b"ftyp":
        kind = _ISO_BRANDS.get(head[8:12])
    if kind is not None and formats is not None:
        return f"{_where(source)}{kind} images are not accepted{_accepted(formats)}"
    return f"{_where(source)}not a recognised image{_accepted(formats)}"


# the signatures of the formats Pillow reads here: bytes that start so are an image of that kind, if corrupt
_ACCEPTED_SIGNATURES = ((b"\x89PNG\r\n\x1a\n", "PNG"), (b"\xff\xd8\xff", "JPEG"))


def _accepted_kind(source: object, formats: tuple[str, ...] | None) -> str | None:
    """The accepted format whose signature `source` starts with (WebP: RIFF....WEBP), else None."""
    if isinstance(source, Image.Image):
        return None
    head = bytes(source[:16]) if isinstance(source, (bytes, bytearray)) else _head(source)
    kind = next((name for magic, name in _ACCEPTED_SIGNATURES if head.startswith(magic)), None)
    if kind is None and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        kind = "WEBP"
    return kind if kind is not None and (formats is None or kind in formats) else None


def _head(path: str | os.PathLike) -> bytes:
    try:
        with open(os.fspath(path), "rb") as f:
            return f.read(16)
    except OSError:
        return b""


def _decode(img: Image.Image, source: object, *, max_pixels: int | None, formats: tuple[str, ...] | None,
            max_side: int | None, max_whole_pixels: int | None) -> Image.Image:
    if formats is not None and img.format not in formats:
        raise NotAnImageError(f"{_where(source)}{img.format} images are not accepted{_accepted(formats)}")
    w, h = img.size
    if max_pixels is not None and w * h > max_pixels:
        raise ImageTooLargeError(f"{_where(source)}image is {w}x{h} = {w * h} pixels, "
                                 f"more than the limit of {max_pixels}")
    if w == 0 or h == 0:
        raise CorruptImageError(f"{_where(source)}image has zero size")
    if img.format == "PNG" and w > MAX_PNG_WIDTH:
        raise ImageTooLargeError(f"{_where(source)}image is {w} pixels wide, more than the limit of {MAX_PNG_WIDTH} "
                                 "for PNG images (a PNG is decoded a whole row at a time)")
    streamable = _png_streamable(img)
    if max_whole_pixels is not None and w * h > max_whole_pixels and not streamable and img.format != "JPEG":
        raise ImageTooLargeError(
            f"{_where(source)}image is {w}x{h} = {w * h} pixels, more than the limit of {max_whole_pixels} for "
            f"{_kind(img)} images, which are decoded at full size (JPEG and 8-bit PNG images are decoded "
            "downscaled and may be larger)")
    if max_side is None or max(w, h) <= max_side:
        img.load()
        return to_rgb(ImageOps.exif_transpose(img))
    orientation = _orientation(img)
    target = capped_size((w, h), max_side)
    if streamable:
        strips, size = _png_strips(img), img.size
    else:
        if img.format == "JPEG":
            img.draft(img.mode, target)  # DCT scaling (1/2 .. 1/8): never smaller than the target
        img.load()
        strips, size = _bands(img), img.size
    small = _reduce_strips(strips, size, target)
    method = _ORIENTATION.get(orientation)
    return small.transpose(method) if method is not None else small


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
    """Strips (top to bottom, full width) -> RGB at `target`: each strip converted and box-reduced as it
    comes, so only one strip exists at full resolution; then one resize to the exact size."""
    w, h = size
    fx, fy = max(1, w // target[0]), max(1, h // target[1])  # per axis: a 1 x 40M image reduces its long side
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


# ---- PNG, a strip at a time -----------------------------------------------------------------------
_PNG_BYTES_PER_PIXEL = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4, "P": 1}


def _png_streamable(img: Image.Image) -> bool:
    """8-bit, non-interlaced PNG: what `_png_strips` decodes (anything else is decoded whole)."""
    return (img.format == "PNG" and len(img.tile) == 1 and img.tile[0].codec_name == "zip"
            and img.tile[0].args == img.mode and img.mode in _PNG_BYTES_PER_PIXEL
            and not img.info.get("interlace"))


def _png_strips(img: Image.Image) -> Callable[[int], Iterator[Image.Image]]:
    """The image data (IDAT) inflated incrementally, `rows` at a time, each strip unfiltered by
    Pillow's own PNG decoder: the strip is handed over behind the previous strip's last row (stored
    unfiltered), which the filters of its first row refer to, and that row is cropped off again."""
    w, h = img.size
    stride = w * _PNG_BYTES_PER_PIXEL[img.mode]  # unfiltered bytes per row
    fp = img.fp
    offset = img.tile[0].offset
    palette = img.palette
    transparency = img.info.get("transparency")

    def strip_of(block: bytes, n: int, previous: bytes) -> Image.Image:
        raw = zlib.compress(b"\x00" + previous + block, 0)  # the previous row, filter type 0 (none)
        strip = Image.frombytes(img.mode, (w, n + 1), raw, "zip", img.mode)
        if palette is not None:
            strip.putpalette(palette.palette, palette.rawmode or palette.mode)
        if transparency is not None:
            strip.info["transparency"] = transparency
        return strip

    def strips(rows: int) -> Iterator[Image.Image]:
        inflate = zlib.decompressobj()
        pending = bytearray()
        previous = bytes(stride)  # the row before the first counts as zeros (PNG spec)
        done = 0
        for piece in _idat_pieces(fp, offset):
            data = piece
            while data and done < h:
                pending += inflate.decompress(data, 1 << 20)  # bounded output per call
                data = inflate.unconsumed_tail
                n = min(rows, h - done)
                while done < h and len(pending) >= n * (stride + 1):
                    strip = strip_of(bytes(pending[:n * (stride + 1)]), n, previous)
                    del pending[:n * (stride + 1)]
                    previous = strip.crop((0, n, w, n + 1)).tobytes()
                    done += n
                    yield strip.crop((0, 1, w, n + 1))
                    n = min(rows, h - done)
            if done >= h or inflate.eof:
                break
        if done < h:
            raise OSError(f"image data ends after {done + len(pending) // (stride + 1)} of {h} rows")
    return strips


def _idat_pieces(fp, offset: int) -> Iterator[bytes]:
    """The bytes of consecutive IDAT chunks, the first one's data starting at `offset`, in 64 KiB pieces."""
    fp.seek(offset - 8)
    while True:
        head = fp.read(8)
        if len(head) < 8:
            return
        length, kind = struct.unpack(">I4s", head)
        if kind != b"IDAT":
            return
        left = length
        while left:
            piece = fp.read(min(left, 1 << 16))
            if not piece:
                return
            left -= len(piece)
            yield piece
        fp.read(4)  # CRC


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


# a content image shrunk to the model's square is first reduced by whole factors (a box filter) to within 3x of it,
# then resized: Pillow's "indistinguishable from fair resampling in most cases"; 1024 px to 64 px in 1.1 ms, not 5.3
# (0.1-0.3 levels mean difference on the bundled examples)
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
    """Map a square result back to the original size (capped at `max_side`).

    `pad` and `stretch` give the original aspect ratio; `crop` gives the centre square it generated.
    `max_side` caps the long side of the result (for `crop`, the square's side).
    """
    if fit.mode == "pad":
        img = img.crop(fit.box)
    return img.resize(result_size(fit, max_side), Image.BICUBIC)


def result_size(fit: Fit, max_side: int | None = None) -> tuple[int, int]:
    """The (w, h) `unfit` returns: the original size capped at `max_side`; for `crop` the centre square it generated,
    at the short side's size."""
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
