"""Images at the service's edge: decoding uploads, colour preservation and encoding responses."""
from __future__ import annotations

import base64
import io
from typing import Literal

from PIL import Image, ImageOps

from stylevar.images import load_image

UPLOAD_FORMATS = ("JPEG", "PNG", "WEBP")
OutputFormat = Literal["png", "jpeg", "webp"]
MEDIA_TYPES: dict[str, str] = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}


def decode_upload(data: bytes, *, max_pixels: int) -> Image.Image:
    """Uploaded bytes -> 8-bit RGB, EXIF orientation applied; raises `stylevar.images.ImageError`."""
    return load_image(data, max_pixels=max_pixels, formats=UPLOAD_FORMATS)


def preserve_color(result: Image.Image, content: Image.Image) -> Image.Image:
    """Keep the content's colours and the result's texture.

    The luminance (Y of YCbCr) comes from the stylized result, the chroma (Cb, Cr) from the content
    image resampled onto the result's frame.
    """
    content = ImageOps.fit(content.convert("RGB"), result.size, Image.BICUBIC)
    y, _, _ = result.convert("YCbCr").split()
    _, cb, cr = content.convert("YCbCr").split()
    return Image.merge("YCbCr", (y, cb, cr)).convert("RGB")


def encode_image(img: Image.Image, fmt: OutputFormat) -> bytes:
    buf = io.BytesIO()
    if fmt == "png":
        img.save(buf, format="PNG", optimize=False)
    elif fmt == "jpeg":
        img.convert("RGB").save(buf, format="JPEG", quality=92)
    elif fmt == "webp":
        img.save(buf, format="WEBP", quality=92)
    else:
        raise ValueError(f"unknown output format {fmt!r}")
    return buf.getvalue()


def to_base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")

