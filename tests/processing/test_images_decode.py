"""Safe, bounded decoding (`stylevar.processing.images.load_image`): downscaled decodes match full ones, every
decoder failure is an ImageError with a readable message, and a large image never exists at full size."""
from __future__ import annotations

import io
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stylevar.processing.images import (
    ACCEPTED_FORMATS,
    CorruptImageError,
    Fit,
    ImageTooLargeError,
    NotAnImageError,
    capped_size,
    load_image,
    to_rgb,
    unfit,
)


def encode(img: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def noisy(w: int, h: int) -> np.ndarray:
    x, y = np.meshgrid(np.linspace(0, 255, w), np.linspace(0, 255, h))
    rgb = np.stack([x, y, 255 - x], -1) + np.random.default_rng(0).integers(-25, 25, (h, w, 3))
    return rgb.clip(0, 255).astype(np.uint8)


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def with_chunk(png: bytes, extra: bytes) -> bytes:
    """`extra` inserted right after IHDR (signature 8 bytes + IHDR chunk 25 bytes)."""
    return png[:33] + extra + png[33:]


def full_then_reduced(data: bytes, size: tuple[int, int]) -> Image.Image:
    """The reference: decode whole, convert, box-reduce by the same factor, resize to `size`."""
    ref = to_rgb(Image.open(io.BytesIO(data)))
    factor = max(1, min(ref.width // size[0], ref.height // size[1]))
    return ref.reduce(factor).resize(size, Image.BICUBIC)


@pytest.mark.parametrize("mode", ["L", "LA", "RGB", "RGBA", "P"])
def test_png_decoded_a_strip_at_a_time_matches_the_whole_decode(mode, monkeypatch):
    import stylevar.processing.images as images
    from stylevar.processing import png_strips

    monkeypatch.setattr(images, "_STRIP_BYTES", 40_000)  # many strips even for a small image
    rgb = noisy(301, 217)
    img = {"L": lambda: Image.fromarray(rgb).convert("L"), "RGB": lambda: Image.fromarray(rgb),
           "RGBA": lambda: Image.fromarray(np.dstack([rgb, rgb[..., 0]])),
           "LA": lambda: Image.fromarray(np.dstack([rgb, rgb[..., 0]])).convert("LA"),
           "P": lambda: Image.fromarray(rgb).convert("P")}[mode]()
    for optimize in (False, True):  # different filter choices per row
        data = encode(img, optimize=optimize)
        assert png_strips.streamable(Image.open(io.BytesIO(data)))
        got = load_image(data, max_side=64)
        assert got.mode == "RGB" and got.size == capped_size((301, 217), 64) == (64, 46)
        assert np.array_equal(np.asarray(got), np.asarray(full_then_reduced(data, got.size)))


@pytest.mark.parametrize("fmt,kw", [("JPEG", {"quality": 95}), ("WEBP", {"lossless": True}), ("PNG16", {})])
def test_other_formats_decode_downscaled(fmt, kw):
    if fmt == "PNG16":
        data = encode(Image.fromarray(noisy(300, 200)[..., 0].astype(np.uint16) * 257))
    else:
        data = encode(Image.fromarray(noisy(300, 200)), fmt, **kw)
    got = load_image(data, max_side=100)
    assert got.size == (100, 67) and got.mode == "RGB"
    diff = np.abs(np.asarray(got, int) - np.asarray(full_then_reduced(data, got.size), int))
    assert diff.mean() < 3  # JPEG's DCT scaling is not a box filter; the rest match closely


def test_small_images_and_no_max_side_decode_whole():
    data = encode(Image.fromarray(noisy(40, 30)))
    assert np.array_equal(np.asarray(load_image(data, max_side=64)), noisy(40, 30))
    assert load_image(data).size == (40, 30)


def test_exif_orientation_applies_to_downscaled_decodes():
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise when displayed
    data = encode(Image.fromarray(noisy(300, 200)), "JPEG", exif=exif.tobytes())
    assert load_image(data).size == (200, 300)
    assert load_image(data, max_side=90).size == (60, 90)


def test_capped_size_is_what_unfit_returns():
    for size in [(6000, 4001), (90, 60), (1025, 7), (7, 3000)]:
        fit = Fit("stretch", size, (0, 0, 64, 64))
        assert unfit(Image.new("RGB", (64, 64)), fit, max_side=1024).size == capped_size(size, 1024)


# ---- failures ---------------------------------------------------------------------------------------
def test_png_text_chunk_over_pillows_limit_is_a_corrupt_image():
    png = encode(Image.new("RGB", (8, 8)))
    bomb = with_chunk(png, chunk(b"zTXt", b"k\x00\x00" + zlib.compress(b"a" * (2 << 20))))
    for max_side in (None, 4):
        with pytest.raises(CorruptImageError, match="MAX_TEXT_CHUNK"):
            load_image(bomb, max_side=max_side)


def test_truncated_and_garbled_images_are_corrupt():
    data = encode(Image.fromarray(noisy(200, 150)))
    for bad in (data[: len(data) // 2], data[:60], data[:200] + b"\x00" * 500):
        for max_side in (None, 50):
            with pytest.raises(CorruptImageError):
                load_image(bad, max_side=max_side)
    with pytest.raises(CorruptImageError):
        load_image(encode(Image.fromarray(noisy(200, 150)), "JPEG")[:300], max_side=50)


def test_refused_formats_are_named():
    gif = encode(Image.new("RGB", (8, 8)), "GIF")
    with pytest.raises(NotAnImageError, match=r"^GIF images are not accepted \(accepted: JPEG, PNG, WebP\)$"):
        load_image(gif, formats=ACCEPTED_FORMATS)
    with pytest.raises(NotAnImageError, match=r"^not a recognised image \(accepted: JPEG, PNG, WebP\)$"):
        load_image(b"hello, this is text", formats=ACCEPTED_FORMATS)
    assert load_image(gif).size == (8, 8)  # without `formats` any Pillow format is fine


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_image(tmp_path / "missing.png")
    with pytest.raises(CorruptImageError, match=str(tmp_path)):
        load_image(tmp_path)  # a directory
    (tmp_path / "notes.png").write_text("not an image")
    with pytest.raises(NotAnImageError, match=r"notes\.png: not a recognised image"):
        load_image(tmp_path / "notes.png", formats=ACCEPTED_FORMATS)


def test_pixel_limits():
    webp = encode(Image.new("RGB", (100, 50)), "WEBP")
    with pytest.raises(ImageTooLargeError, match="100x50 = 5000 pixels, more than the limit of 4999 for WebP"):
        load_image(webp, max_pixels=4999)  # decoded whole only: refused, not shrunk
    with pytest.raises(ImageTooLargeError, match="limit of 4000 for WebP images"):
        load_image(webp, max_whole_pixels=4000)
    data = encode(Image.new("RGB", (100, 50)))
    assert load_image(data, max_whole_pixels=4000, max_side=20).size == (20, 10)  # PNG decodes downscaled
    jpeg = encode(Image.new("RGB", (100, 50)), "JPEG")
    assert load_image(jpeg, max_whole_pixels=4000, max_side=20).size == (20, 10)


def solid_png(path: Path, w: int, h: int) -> None:
    """A solid-colour RGB PNG written without ever holding the image (a few hundred KB on disk)."""
    row = b"\x00" + bytes((200, 30, 40)) * w
    z = zlib.compressobj(9)
    idat = b"".join(z.compress(row) for _ in range(h)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


@pytest.mark.slow
def test_a_36_megapixel_png_never_exists_at_full_size(tmp_path):
    """108 MB of pixels decoded to 1024 px: the decoding process grows by a few tens of MB at most."""
    png = tmp_path / "big.png"
    solid_png(png, 6000, 6000)
    script = (
        "import resource, sys\n"
        "from stylevar.processing.images import load_image\n"
        "data = open(sys.argv[1], 'rb').read()\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "img = load_image(data, max_side=1024)\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(img.size[0], img.size[1], ','.join(map(str, img.getpixel((5, 5)))), (after - before) // 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(png)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    w, h, pixel, added_mb = out.stdout.split()
    assert (int(w), int(h)) == (1024, 1024) and pixel == "200,30,40"
    assert int(added_mb) < 60, f"decoding added {added_mb} MB"


def test_a_png_with_a_bad_crc_or_no_pixels_is_a_corrupt_image_not_an_unknown_format():
    from stylevar.processing.images import ACCEPTED_FORMATS, CorruptImageError, NotAnImageError, load_image

    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (1, 2, 3)).save(buf, "PNG")
    bad_crc = bytearray(buf.getvalue())
    bad_crc[29] ^= 0xFF  # the header chunk's CRC

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    zero = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 0, 0, 8, 2, 0, 0, 0)) + chunk(b"IEND", b"")
    for data in (bytes(bad_crc), zero):
        with pytest.raises(CorruptImageError, match="corrupt PNG image"):
            load_image(data, formats=ACCEPTED_FORMATS)
    with pytest.raises(NotAnImageError, match="not a recognised image"):
        load_image(b"plain text, not a picture", formats=ACCEPTED_FORMATS)


def _one_colour_rgba_png(w: int, h: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    comp = zlib.compressobj(9)
    row = b"\x00" + b"\x10\x20\x30\xff" * w
    idat = b"".join(comp.compress(row) for _ in range(h)) + comp.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0)) + chunk(b"IDAT", idat)
            + chunk(b"IEND", b""))


@pytest.mark.slow
def test_extreme_aspect_pngs_decode_in_bounded_memory_or_are_refused(tmp_path):
    """A 1 x N PNG reduces its long side (reducing it by 1 would cost 1.7 GB for 1 x 40M); an N x 1 PNG
    wider than MAX_PNG_WIDTH is refused (its one row alone is N x 4 bytes)."""
    from stylevar.processing.images import ACCEPTED_FORMATS, MAX_PNG_WIDTH, ImageTooLargeError, load_image

    tall = tmp_path / "tall.png"
    tall.write_bytes(_one_colour_rgba_png(1, 4_000_000))
    # VmHWM (this process's peak since exec; ru_maxrss would count the forked parent too)
    probe = ("import sys\nfrom stylevar.processing.images import load_image, ACCEPTED_FORMATS\n"
             "def kb(key): return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith(key))\n"
             "data = open(sys.argv[1], 'rb').read()\nbefore = kb('VmRSS')\n"
             "img = load_image(data, formats=ACCEPTED_FORMATS, max_side=8192)\n"
             "print(img.size, (kb('VmHWM') - before) / 1024)\n")
    out = subprocess.run([sys.executable, "-c", probe, str(tall)], capture_output=True, text=True, check=True).stdout
    size, added_mb = out.rsplit(" ", 1)
    assert size == "(1, 8192)" and float(added_mb) < 100, out
    with pytest.raises(ImageTooLargeError, match="pixels wide"):
        load_image(_one_colour_rgba_png(MAX_PNG_WIDTH + 1, 1), formats=ACCEPTED_FORMATS, max_side=8192)
