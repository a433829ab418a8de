"""8-bit PNG decoded a strip of rows at a time (`strips`), so that a large PNG never exists at full size in memory;
`stylevar.processing.images` reduces each strip as it comes.
"""
from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator

from PIL import Image

_BYTES_PER_PIXEL = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4, "P": 1}


def streamable(img: Image.Image) -> bool:
    """8-bit, non-interlaced PNG: what `strips` decodes (anything else is decoded whole)."""
    return (img.format == "PNG" and len(img.tile) == 1 and img.tile[0].codec_name == "zip"
            and img.tile[0].args == img.mode and img.mode in _BYTES_PER_PIXEL and not img.info.get("interlace"))


def strips(img: Image.Image) -> Callable[[int], Iterator[Image.Image]]:
    """The image data (IDAT) inflated `rows` at a time, each strip unfiltered by Pillow's decoder behind the
    previous strip's last row (which its filters refer to), that row cropped off again."""
    w, h = img.size
    stride = w * _BYTES_PER_PIXEL[img.mode]  # unfiltered bytes per row
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

    def rows_of(rows: int) -> Iterator[Image.Image]:
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
    return rows_of


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
