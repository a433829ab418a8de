"""data_tools.qt_resources on Qt resource bundles written here byte by byte in the format `rcc -binary` writes
(header, tree of fixed-size entries, names table, data blocks; big-endian), and its refusals."""
from __future__ import annotations

import struct
import zlib

import pytest

from data_tools.qt_resources import COMPRESSED_ZLIB, COMPRESSED_ZSTD, DIRECTORY, RccError, read_rcc

FILES = {"top.txt": b"top level", "activities/details/Gogh4_background.webp": b"RIFF" + bytes(range(256)) * 4,
         "activities/details/caf\u00e9.png": b"\x89PNG small"}
COMPRESSED = "activities/details/Gogh4_background.webp"


def _qt_hash(name: str) -> int:
    """Qt's qt_hash over the UTF-16 code units (the names table stores it; the reader does not need it)."""
    h = 0
    for unit in struct.unpack(f">{len(name.encode('utf-16-be')) // 2}H", name.encode("utf-16-be")):
        h = (h << 4) + unit
        h ^= (h & 0xF0000000) >> 23
        h &= 0x0FFFFFFF
    return h


def build_rcc(version: int = 3, zlib_file: str = COMPRESSED, file_flags: int = 0) -> bytes:
    """root/{top.txt, activities/{details/{Gogh4_background.webp (zlib), café.png}}}; `file_flags` is added to
    every file entry's flags."""
    names, data = bytearray(), bytearray()

    def name(text: str) -> int:
        at, encoded = len(names), text.encode("utf-16-be")
        names.extend(struct.pack(">HI", len(text), _qt_hash(text)) + encoded)
        return at

    def blob(path: str) -> tuple[int, int]:
        at, raw = len(data), FILES[path]
        payload = struct.pack(">I", len(raw)) + zlib.compress(raw) if path == zlib_file else raw  # qCompress
        data.extend(struct.pack(">I", len(payload)) + payload)
        return at, (COMPRESSED_ZLIB if path == zlib_file else 0) | file_flags

    def directory(text: str, count: int, first: int) -> tuple:
        return (name(text) if text else 0, DIRECTORY, count, first)

    def file(text: str, path: str) -> tuple:
        at, flags = blob(path)
        return (name(text), flags, 0, at)  # a file: country and language (0), its data offset

    entries = [directory("", 2, 1),                               # 0: root -> 1, 2
               directory("activities", 1, 3), file("top.txt", "top.txt"),
               directory("details", 2, 4),                         # 3 -> 4, 5
               file("Gogh4_background.webp", COMPRESSED), file("caf\u00e9.png", "activities/details/caf\u00e9.png")]
    mtime = b"" if version == 1 else bytes(8)  # version 2 adds the modification time: 22-byte entries
    tree = b"".join(struct.pack(">IHII", *e) + mtime for e in entries)
    header_size = 20 + (4 if version >= 3 else 0)  # version 3 adds the bundle's flags
    tree_at = header_size
    data_at = tree_at + len(tree)
    names_at = data_at + len(data)
    header = b"qres" + struct.pack(">IIII", version, tree_at, data_at, names_at) + bytes(header_size - 20)
    return header + tree + bytes(data) + bytes(names)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_reads_every_file_by_its_path(tmp_path, version):
    path = tmp_path / "bundle.rcc"
    path.write_bytes(build_rcc(version))
    assert read_rcc(path) == FILES


def test_entries_are_22_bytes_from_version_2():
    assert len(build_rcc(2)) - len(build_rcc(1)) == 6 * 8  # six entries, 8 more bytes each
    assert len(build_rcc(3)) - len(build_rcc(2)) == 4


def test_not_a_bundle_unknown_version_and_zstd_are_refused(tmp_path):
    path = tmp_path / "x.rcc"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(40))
    with pytest.raises(RccError, match="not a Qt resource bundle"):
        read_rcc(path)
    path.write_bytes(b"qres" + struct.pack(">IIII", 9, 20, 20, 20))
    with pytest.raises(RccError, match="version 9 is not supported"):
        read_rcc(path)
    path.write_bytes(build_rcc(3, zlib_file="", file_flags=COMPRESSED_ZSTD))
    with pytest.raises(RccError, match="zstd"):
        read_rcc(path)
    assert issubclass(RccError, ValueError)
