"""What a file is, from its first bytes: for a clearer refusal when Pillow cannot open it (`images.decode_image`)."""
from __future__ import annotations

import os

from PIL import Image

# a few formats a user may try
_OTHERS = ((b"GIF87a", "GIF"), (b"GIF89a", "GIF"), (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"),
           (b"8BPS", "PSD"), (b"%PDF", "PDF"))
_ISO_BRANDS = {b"heic": "HEIC", b"heix": "HEIC", b"mif1": "HEIF", b"avif": "AVIF"}
# the formats Pillow reads here: bytes that start so are an image of that kind, if corrupt (WebP: RIFF....WEBP)
_ACCEPTED = ((b"\x89PNG\r\n\x1a\n", "PNG"), (b"\xff\xd8\xff", "JPEG"))


def head(source: str | os.PathLike | bytes | Image.Image) -> bytes:
    """The first 16 bytes of `source` (nothing for an opened image, or a file that cannot be read)."""
    if isinstance(source, Image.Image):
        return b""
    if isinstance(source, (bytes, bytearray)):
        return bytes(source[:16])
    try:
        with open(os.fspath(source), "rb") as f:
            return f.read(16)
    except OSError:
        return b""


def other_kind(first: bytes) -> str | None:
    """The name of a format this is not read as (GIF, TIFF, HEIC ...), recognised from the `first` bytes."""
    kind = next((name for magic, name in _OTHERS if first.startswith(magic)), None)
    return _ISO_BRANDS.get(first[8:12]) if kind is None and first[4:8] == b"ftyp" else kind


def accepted_kind(first: bytes, formats: tuple[str, ...] | None) -> str | None:
    """The accepted format whose signature the `first` bytes start with, else None."""
    kind = next((name for magic, name in _ACCEPTED if first.startswith(magic)), None)
    if kind is None and first[:4] == b"RIFF" and first[8:12] == b"WEBP":
        kind = "WEBP"
    return kind if kind is not None and (formats is None or kind in formats) else None
