"""Decoding bounded in work, not only in pixels (`stylevar.processing.decode_bounds`, `images.decode_image`): a JPEG
scan bomb is refused before it is decoded, a decode stops at its deadline, a camera's MPO gives its first picture, and
a photo over the pixel limit is halved while decoding (one rule, `decoded_size`) instead of refused."""
from __future__ import annotations

import io
import struct
import time

import numpy as np
import pytest
from PIL import Image

from stylevar.processing import png_strips
from stylevar.processing.decode_bounds import MAX_SCANS, DecodeTimeout, TimedReader, count_scans
from stylevar.processing.images import (
    ACCEPTED_FORMATS,
    MAX_SOURCE_PIXELS,
    ImageTooCostlyError,
    ImageTooLargeError,
    decode_image,
    decoded_size,
    load_image,
    shrink_factor,
    to_rgb,
)
from tests.processing.test_images_decode import chunk, encode, noisy


def progressive(size: tuple[int, int] = (64, 48), mode: str = "RGB", colour=(120, 130, 140)) -> bytes:
    return encode(Image.new(mode, size, colour[:len(mode)] if mode != "L" else colour[0]), "JPEG", progressive=True,
                  quality=90)


def scan_bomb(side: int, extra_scans: int) -> bytes:
    """A valid progressive JPEG (Pillow's, 10 scans) with its last AC scan, and the Huffman table sent right before
    it, repeated `extra_scans` times: what issue 55 sent at 6000 x 6000 with 20,000 scans (1.3 MB)."""
    data = progressive((side, side))
    eoi = len(data) - 2  # Pillow ends the file with EOI
    last_table = data.rfind(b"\xff\xc4")  # 0xFF 0xC4 (DHT) cannot occur inside entropy-coded data
    assert data.rfind(b"\xff\xda") > last_table and data[eoi:] == b"\xff\xd9"
    return data[:eoi] + data[last_table:eoi] * extra_scans + data[eoi:]


def test_encoders_write_few_scans_and_the_count_reads_the_markers():
    assert count_scans(progressive()) == 10  # libjpeg's progressive script, colour
    assert count_scans(progressive(mode="L")) == 6
    assert count_scans(progressive(mode="CMYK")) == 18
    assert count_scans(encode(Image.fromarray(noisy(64, 48)), "JPEG", restart_marker_blocks=1)) == 1  # RSTn inside
    bomb = scan_bomb(32, 200)
    assert count_scans(bomb, stop_after=10_000) == 210
    assert count_scans(bomb) == MAX_SCANS + 1  # the count stops once past the limit
    two = io.BytesIO()
    Image.new("RGB", (32, 24), "red").save(two, "MPO", save_all=True, append_images=[Image.new("RGB", (32, 24))],
                                           progressive=True)
    assert two.getvalue().count(b"\xff\xda") == 20 and count_scans(two.getvalue()) == 10  # the first picture only


def test_a_scan_bomb_is_refused_before_decoding_from_bytes_and_from_a_file(tmp_path):
    bomb = scan_bomb(256, 2000)
    with Image.open(io.BytesIO(bomb)) as valid:  # Pillow decodes it: a valid file, only slow at a large size
        valid.load()
    for source in (bomb, tmp_path / "bomb.jpg"):
        (tmp_path / "bomb.jpg").write_bytes(bomb)
        with pytest.raises(ImageTooCostlyError, match=f"more than {MAX_SCANS} scans") as e:
            load_image(source, formats=ACCEPTED_FORMATS, max_side=64)
        assert e.value.code == "image_too_costly"
    # at the limit it decodes; one scan more is refused
    assert load_image(scan_bomb(64, MAX_SCANS - 10)).size == (64, 64)
    with pytest.raises(ImageTooCostlyError):
        load_image(scan_bomb(64, MAX_SCANS - 9))
    with pytest.raises(ImageTooCostlyError):  # an image opened by the caller, not decoded yet
        load_image(Image.open(io.BytesIO(bomb)))


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_a_decode_stops_at_its_next_read_after_its_deadline(fmt):
    data = encode(Image.fromarray(noisy(400, 300)), fmt)
    img = Image.open(TimedReader(io.BytesIO(data), timeout_s=60))
    img.fp.deadline = time.monotonic() - 1  # its time ran out after the header was read
    with pytest.raises(DecodeTimeout, match="longer than its 60 s"):
        img.load()
    reader = TimedReader(io.BytesIO(encode(Image.fromarray(noisy(400, 300)))), timeout_s=60)
    rows = png_strips.strips(Image.open(reader))(10)
    next(rows)  # the first strip, from the first 64 KiB of image data
    reader.deadline = time.monotonic() - 1
    with pytest.raises(DecodeTimeout):  # the strip decoder reads through it too
        list(rows)


def test_decode_image_maps_a_timeout_to_an_image_error(tmp_path):
    data = encode(Image.fromarray(noisy(64, 48)))
    with pytest.raises(ImageTooCostlyError, match="took longer than its 0 s") as e:
        decode_image(data, timeout_s=0)
    assert e.value.code == "image_too_costly"
    (tmp_path / "x.png").write_bytes(data)
    with pytest.raises(ImageTooCostlyError, match=r"x\.png: decoding the image took longer"):
        decode_image(tmp_path / "x.png", timeout_s=0)
    assert decode_image(data, timeout_s=60).image.size == (64, 48)


@pytest.mark.parametrize("max_side", [None, 16])
def test_an_mpo_gives_its_first_picture(max_side):
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (220, 20, 20)).save(buf, "MPO", save_all=True,
                                                    append_images=[Image.new("RGB", (64, 48), (20, 20, 220))])
    assert Image.open(io.BytesIO(buf.getvalue())).format == "MPO"
    out = load_image(buf.getvalue(), formats=ACCEPTED_FORMATS, max_side=max_side)
    assert out.size == ((64, 48) if max_side is None else (16, 12))
    r, g, b = np.asarray(out, np.float64).reshape(-1, 3).mean(0)
    assert r > 200 and b < 40  # red: the primary picture, not the second


def test_the_shrink_rule():
    assert shrink_factor((12000, 9000), 40_000_000) == 2 and decoded_size((12000, 9000)) == (6000, 4500)
    assert decoded_size((8000, 8000)) == (4000, 4000)
    assert decoded_size((16000, 11000)) == (4000, 2750)  # 176 MP: a quarter a side
    assert decoded_size((6000, 4000)) == (6000, 4000)  # within the limit: as it is
    assert decoded_size((12001, 9001)) == (6001, 4501)  # sides rounded up, as DCT scaling and reduce() give them
    # the long side cap first: when it alone brings the image within the limit, nothing is halved
    assert shrink_factor((12000, 9000), 40_000_000, 1024) == 1 and decoded_size((12000, 9000), 1024) == (1024, 768)
    assert decoded_size((12000, 9000), 8192) == (6000, 4500)  # 8192 x 6144 would be 50 MP
    assert decoded_size((1, 100_000_000), None, 40_000_000) == (1, 25_000_000)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_an_image_over_the_pixel_limit_is_halved_while_decoding(fmt, monkeypatch):
    import stylevar.processing.images as images

    monkeypatch.setattr(images, "_STRIP_BYTES", 40_000)  # many strips even for a small image
    rgb = noisy(301, 217)
    data = encode(Image.fromarray(rgb), fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    out = decode_image(data, max_pixels=20_000, formats=ACCEPTED_FORMATS)
    assert (out.size, out.shrink, out.image.size) == ((301, 217), 2, (151, 109)) == \
           ((301, 217), shrink_factor((301, 217), 20_000), decoded_size((301, 217), None, 20_000))
    assert out.shrink_note("content") == ("the content image is 301x217 = 65317 pixels, more than the limit of "
                                          "20000: it was shrunk 2x while decoding, to 151x109")
    if fmt == "PNG":  # strip by strip: the same pixels as the whole decode box-reduced
        whole = to_rgb(Image.open(io.BytesIO(data))).reduce(2)
        assert np.array_equal(np.asarray(out.image), np.asarray(whole))
    assert decode_image(data, max_pixels=301 * 217).shrink == 1


def test_orientation_is_applied_to_the_reported_size():
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees
    data = encode(Image.fromarray(noisy(300, 200)), "JPEG", exif=exif)
    out = decode_image(data, max_pixels=20_000)
    assert out.size == (200, 300) and out.image.size == (100, 150) and out.shrink == 2


def test_formats_decoded_whole_are_refused_over_the_limit_and_no_file_past_the_source_limit(tmp_path):
    webp = encode(Image.new("RGB", (100, 50)), "WEBP")
    with pytest.raises(ImageTooLargeError, match="only JPEG and 8-bit PNG images are shrunk while decoding"):
        decode_image(webp, max_pixels=4999)
    ihdr = encode(Image.new("RGB", (1, 1)))[16:29]  # width, height, depth, colour type ...
    huge = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">II", 20_000, 9_000) + ihdr[8:]) + chunk(b"IEND", b"")
    with pytest.raises(ImageTooLargeError, match=f"more than the limit of {MAX_SOURCE_PIXELS} pixels"):
        decode_image(huge)  # 180 MP: past MAX_SOURCE_PIXELS (Pillow's own bound), refused from its header alone


def test_the_timed_reader_reads_lines_for_text_headed_formats():
    """Pillow's IM and PPM openers read header lines; with every plugin registered they may try a JPEG first."""
    Image.init()
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (1, 2, 3)).save(buf, "PPM")
    img = Image.open(TimedReader(io.BytesIO(buf.getvalue()), timeout_s=60))
    img.load()
    assert img.format == "PPM" and img.size == (40, 30)
