"""Reinhard colour transfer: the result takes the style's Lab statistics, negative a/b included."""
from __future__ import annotations

import numpy as np
from PIL import Image

from stylevar.baselines.reinhard import _lab, reinhard_transfer


def _gradient(c0, c1, size=32) -> Image.Image:
    t = np.linspace(0, 1, size)[None, :, None]
    img = np.asarray(c0, float)[None, None] * (1 - t) + np.asarray(c1, float)[None, None] * t
    return Image.fromarray(np.repeat(img, size, 0).astype(np.uint8), "RGB")


def test_lab_reads_signed_a_and_b():
    green, blue = _lab(Image.new("RGB", (2, 2), (0, 255, 0)))[0, 0], _lab(Image.new("RGB", (2, 2), (0, 0, 255)))[0, 0]
    assert green[1] < -50 and blue[2] < -80  # a < 0 for green, b < 0 for blue (not wrapped to 0..255)


def test_result_takes_the_style_statistics():
    content = _gradient((200, 40, 40), (250, 200, 60))  # warm: a, b > 0
    style = _gradient((20, 120, 40), (40, 60, 200))  # green to blue: a, b < 0
    out = _lab(reinhard_transfer(content, style)).reshape(-1, 3)
    s = _lab(style).reshape(-1, 3)
    np.testing.assert_allclose(out.mean(0), s.mean(0), atol=4)
    np.testing.assert_allclose(out.std(0), s.std(0), atol=4)
    mean_rgb = np.asarray(reinhard_transfer(content, style), float).reshape(-1, 3).mean(0)
    style_rgb = np.asarray(style, float).reshape(-1, 3).mean(0)
    assert np.linalg.norm(mean_rgb - style_rgb) < 20
