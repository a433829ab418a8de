"""Files packed in a Qt resource bundle (`.rcc`, as `rcc -binary` writes it), read without Qt.

A header (magic ``qres``, version, offsets), a tree of fixed-size entries, a table of UTF-16BE names and the data
blocks (a 32-bit length, then the bytes, zlib- or zstd-compressed per the entry's flags); big-endian throughout.
"""
from __future__ import annotations

import struct
import zlib
from pathlib import Path

COMPRESSED_ZLIB = 0x01
DIRECTORY = 0x02
COMPRESSED_ZSTD = 0x04


class RccError(ValueError):
    """Not a Qt resource bundle, or one this reader does not understand."""


class _Bundle:
    def __init__(self, raw: bytes) -> None:
        if raw[:4] != b"qres":
            raise RccError("not a Qt resource bundle (no 'qres' magic)")
        self.raw = raw
        self.version, self.tree, self.data, self.names = struct.unpack(">IIII", raw[4:20])
        if self.version not in (1, 2, 3):
            raise RccError(f"Qt resource format version {self.version} is not supported (1-3 are)")
        self.entry_size = 14 if self.version == 1 else 22

    def name(self, offset: int) -> str:
        at = self.names + offset
        (length,) = struct.unpack(">H", self.raw[at:at + 2])
        return self.raw[at + 6:at + 6 + 2 * length].decode("utf-16-be")

    def entry(self, index: int) -> tuple[str, int, int, int]:
        """(name, flags, a, b): a directory's (child count, first child); a file's (unused, data offset)."""
        at = self.tree + index * self.entry_size
        name_offset, flags = struct.unpack(">IH", self.raw[at:at + 6])
        a, b = struct.unpack(">II", self.raw[at + 6:at + 14])
        return (self.name(name_offset) if index else ""), flags, a, b

    def payload(self, offset: int, flags: int) -> bytes:
        at = self.data + offset
        (size,) = struct.unpack(">I", self.raw[at:at + 4])
        blob = self.raw[at + 4:at + 4 + size]
        if flags & COMPRESSED_ZLIB:
            return zlib.decompress(blob[4:])  # qCompress: the uncompressed length first
        if flags & COMPRESSED_ZSTD:
            raise RccError("zstd-compressed resources are not supported")
        return blob


def read_rcc(path: Path) -> dict[str, bytes]:
    """Every file in the bundle at `path`, by its path inside the bundle."""
    bundle = _Bundle(path.read_bytes())
    files: dict[str, bytes] = {}
    todo = [(0, "")]
    while todo:
        index, prefix = todo.pop()
        name, flags, a, b = bundle.entry(index)
        here = f"{prefix}/{name}" if prefix else name
        if flags & DIRECTORY:
            todo.extend((b + i, here) for i in range(a))
        else:
            files[here] = bundle.payload(b, flags)
    return files
