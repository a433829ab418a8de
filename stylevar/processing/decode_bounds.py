"""Bounds on the work of decoding one image, beside its pixel limits: a JPEG's scans counted before any pixel is
decoded (`file_scans`, at most `MAX_SCANS`), and a file whose reads stop at a deadline (`TimedReader`).
"""
from __future__ import annotations

import io
import mmap
import re
import time
from typing import BinaryIO

MAX_SCANS = 64

_SOS, _EOI = 0xDA, 0xD9
_STANDALONE = frozenset((0x01, *range(0xD0, 0xD9)))  # TEM, RST0-7, SOI: markers without a length
# in a scan's data 0xFF is followed by 0x00, a restart marker (0xD0-0xD7) or 0xFF; anything else ends the scan
_END_OF_SCAN = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


def count_scans(data: bytes | memoryview | mmap.mmap, stop_after: int = MAX_SCANS) -> int:
    """The scans (SOS markers) of the JPEG in `data` up to its first EOI (an MPO's second picture is not counted),
    read in one pass; counting stops at `stop_after + 1` and a malformed layout ends it."""
    n, i, end = 0, 2, len(data)
    while i + 4 <= end and n <= stop_after:
        if data[i] != 0xFF:
            break
        marker = data[i + 1]
        if marker == 0xFF:  # a fill byte before a marker
            i += 1
        elif marker == _EOI:
            break
        elif marker in _STANDALONE:
            i += 2
        else:
            i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
            if marker == _SOS:
                n += 1
                found = _END_OF_SCAN.search(data, i)
                if found is None:
                    break
                i = found.start()
    return n


def file_scans(fp: BinaryIO) -> int:
    """`count_scans` of the JPEG file `fp` (or a `TimedReader`'s), without a copy; its position is kept."""
    raw = getattr(fp, "raw", fp)
    if isinstance(raw, io.BytesIO):
        with raw.getbuffer() as data:
            return count_scans(data)
    try:
        with mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return count_scans(data)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):  # not a file on disk: read it
        at = raw.tell()
        raw.seek(0)
        data = raw.read()
        raw.seek(at)
        return count_scans(data)


class DecodeTimeout(Exception):
    """A read of a `TimedReader` after its deadline."""


class TimedReader:
    """A file whose reads raise `DecodeTimeout` once `timeout_s` has passed since it was made: a decode stops within
    one read's work of its time (a WebP, read whole first, is bounded by its own pixel limit)."""

    def __init__(self, raw: BinaryIO, timeout_s: float):
        self.raw, self.timeout_s = raw, timeout_s
        self.deadline = time.monotonic() + timeout_s

    def _check(self) -> None:
        if time.monotonic() > self.deadline:
            raise DecodeTimeout(f"decoding the image took longer than its {self.timeout_s:g} s")

    def read(self, size: int = -1) -> bytes:
        self._check()
        return self.raw.read(size)

    def readline(self, size: int = -1) -> bytes:  # Pillow's text-headed formats (IM, PPM, ...) read lines
        self._check()
        return self.raw.readline(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()

    def close(self) -> None:
        self.raw.close()
