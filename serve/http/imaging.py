"""Images at the service's edge: decoding uploads, encoding responses (one image, or a zip of several)."""
from __future__ import annotations

import asyncio
import base64
import io
import warnings
import zipfile
from collections.abc import Sequence
from typing import BinaryIO, Literal

from PIL import Image
from starlette.concurrency import run_in_threadpool

from stylevar.processing.images import ACCEPTED_FORMATS, Decoded, ImageTooLargeError, decode_image, too_many_pixels
from stylevar.processing.postprocess import size_cap

UPLOAD_FORMATS = ACCEPTED_FORMATS
DECODE_TIMEOUT_S = 20.0  # past it an upload's decoding stops at its next read (422 `image_too_costly`)
SHRUNK_HEADER = "X-Content-Shrunk"  # the content was over the pixel limit and shrunk while decoding (`shrink_headers`)
CAPPED_HEADER = "X-Size-Capped"  # the content's long side was over max_output_side: the result is smaller (`cap_headers`)
OutputFormat = Literal["png", "jpeg", "webp"]
MEDIA_TYPES: dict[str, str] = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
EXTENSIONS: dict[str, str] = {"png": "png", "jpeg": "jpg", "webp": "webp"}


def decode_upload(data: bytes, *, max_pixels: int, max_side: int | None = None,
                  max_whole_pixels: int | None = None, timeout_s: float | None = DECODE_TIMEOUT_S) -> Decoded:
    """The command line's `decode_image` over the accepted formats; raises `ImageError`."""
    return decode_image(data, max_pixels=max_pixels, formats=UPLOAD_FORMATS, max_side=max_side,
                        max_whole_pixels=max_whole_pixels, timeout_s=timeout_s)


def cap_headers(content: Decoded, result_size: tuple[int, int], max_side: int) -> dict[str, str]:
    """`X-Size-Capped: 20000x1000->8192x410` when the content's long side was over STYLEVAR_MAX_OUTPUT_SIDE."""
    cap = size_cap(content.size, result_size, max_side)
    return {} if cap is None else {CAPPED_HEADER: cap}


def shrink_headers(content: Decoded) -> dict[str, str]:
    """`X-Content-Shrunk` with the command line's note when the content was shrunk to fit the pixel limit."""
    note = content.shrink_note("content")
    return {} if note is None else {SHRUNK_HEADER: note}


def upload_size(file: BinaryIO) -> tuple[int, int] | None:
    """(width, height) from a file's header (left at its start); None when the header cannot be read."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the decoder's limits apply
            with Image.open(file) as img:
                return img.size
    except Exception:  # noqa: BLE001 - any unreadable header: `decode_upload` names the problem
        return None
    finally:
        file.seek(0)


class PixelBudget:
    """The pixels one request may still decode, all its files together (`ServeSettings.max_request_pixels`)."""

    def __init__(self, pixels: int):
        self.limit = self.left = pixels

    def charge(self, data: bytes) -> None:
        """Count one upload's pixels before it is decoded; `ImageTooLargeError` once the request is over."""
        size = upload_size(io.BytesIO(data))
        if size is None:
            return
        pixels = size[0] * size[1]
        if pixels > self.limit:  # this file alone: refused as the command line refuses a file over its limit
            raise ImageTooLargeError(f"{too_many_pixels(size, self.limit)} (STYLEVAR_MAX_REQUEST_PIXELS)")
        if pixels > self.left:
            raise ImageTooLargeError(f"the request's images have more than {self.limit} pixels in all "
                                     f"({self.limit - self.left} before this one, which has {pixels})")
        self.left -= pixels


class UploadDecoder:
    """Decodes uploads in worker threads, at most `concurrency` at once."""

    def __init__(self, *, max_pixels: int, max_whole_pixels: int, concurrency: int):
        self.max_pixels, self.max_whole_pixels = max_pixels, max_whole_pixels
        self._slots = asyncio.Semaphore(concurrency)

    async def decode(self, data: bytes, *, max_side: int, budget: PixelBudget | None = None) -> Decoded:
        if budget is not None:
            budget.charge(data)
        async with self._slots:
            return await run_in_threadpool(decode_upload, data, max_pixels=self.max_pixels, max_side=max_side,
                                           max_whole_pixels=self.max_whole_pixels)


def encode_image(img: Image.Image, fmt: OutputFormat, png_compress_level: int = 6) -> bytes:
    """`img` in `fmt`; PNG at zlib's ``png_compress_level`` (0-9)."""
    buf = io.BytesIO()
    if fmt == "png":
        img.save(buf, format="PNG", optimize=False, compress_level=png_compress_level)
    elif fmt == "jpeg":
        img.convert("RGB").save(buf, format="JPEG", quality=92)
    elif fmt == "webp":
        img.save(buf, format="WEBP", quality=92)
    else:
        raise ValueError(f"unknown output format {fmt!r}")
    return buf.getvalue()


def to_base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def zip_images(encoded: Sequence[bytes], seeds: Sequence[int], fmt: OutputFormat) -> bytes:
    """One stored (not deflated) zip, a file per sample named by its seed (`seed-40.png`), in sample order."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as archive:
        for seed, data in zip(seeds, encoded, strict=True):
            archive.writestr(f"seed-{seed}.{EXTENSIONS[fmt]}", data)
    return buf.getvalue()
