"""Extreme aspect ratios through the real service (`python -m serve`), in every file field: a 1 x 40M
PNG (190 KB on the wire, 40 megapixels) costs the server well under 100 MB and is answered (within the deadline); a
40M x 1 PNG is refused from its header; nine such files in one request are refused by the request's pixel budget
before most of them are decoded. (JPEG and WebP cannot be that long: their headers stop at 65,535 and 16,383 px.)"""
from __future__ import annotations

import struct
import zlib

import httpx
import pytest

from serve.testing import ServerProcess
from stylevar.loaders.model_dir import DEMO_MODEL_DIR

pytestmark = pytest.mark.slow  # the fast lane (-m "not slow") leaves this file out


def one_colour_png(w: int, h: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    comp = zlib.compressobj(9)
    row = b"\x00" + b"\x10\x80\x30\xff" * w
    idat = b"".join(comp.compress(row) for _ in range(h)) + comp.flush() if h < 1000 else _many_rows(comp, row, h)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0)) + chunk(b"IDAT", idat)
            + chunk(b"IEND", b""))


def _many_rows(comp, row: bytes, h: int) -> bytes:
    block = row * 100_000
    out = [comp.compress(block) for _ in range(h // 100_000)]
    out.append(comp.compress(row * (h % 100_000)))
    return b"".join(out) + comp.flush()


def peak_mb(pid: int) -> float:
    """The server's peak resident memory since it started (VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess.serve(DEMO_MODEL_DIR, settings={"STYLEVAR_WARMUP": "true", "STYLEVAR_REQUEST_TIMEOUT_S": "60"},
                              log_dir=tmp_path_factory.mktemp("logs"))
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


@pytest.mark.slow
def test_a_1_by_40m_png_in_each_field_costs_little_memory_and_keeps_the_deadline(server):
    tall = one_colour_png(1, 40_000_000)
    small = one_colour_png(32, 32)
    with httpx.Client(base_url=server.url, timeout=120) as c:
        assert c.post("/stylize", files={"content": ("c.png", small), "style": ("s.png", small)}).status_code == 200
        for field in ("content", "style", "style_mask"):
            files = {"content": ("c.png", small), "style": ("s.png", small)}
            files[field] = ("tall.png", tall)
            before = peak_mb(server.proc.pid)
            r = c.post("/stylize", files=files)
            assert r.status_code == 200, (field, r.text)  # within the 60 s deadline: past it the answer is 504
            assert peak_mb(server.proc.pid) - before < 100, field


@pytest.mark.slow
def test_a_40m_by_1_png_and_nine_long_files_are_refused_quickly(server):
    small = one_colour_png(32, 32)
    with httpx.Client(base_url=server.url, timeout=120) as c:
        r = c.post("/stylize", files={"content": ("wide.png", one_colour_png(40_000_000, 1)), "style": ("s.png", small)})
        assert r.status_code == 413 and "pixels wide" in r.json()["detail"], r.text  # from its header
        tall = one_colour_png(1, 40_000_000)
        nine = [("content", ("c.png", tall))] + [("style", (f"s{i}.png", tall)) for i in range(4)] + \
               [("style_mask", (f"m{i}.png", tall)) for i in range(4)]
        r = c.post("/stylize", files=nine)
        assert r.status_code == 413 and "in all" in r.json()["detail"], r.text
        assert "(120000000 before this one" in r.json()["detail"], r.text  # three of the nine decoded, no more
