"""Reinhard et al. (2001) colour transfer: the content recoloured to the style's Lab mean and std.

A weight-free baseline: it moves colour statistics and nothing else (no texture, no structure change).
Lab conversion uses LittleCMS through PIL's ImageCms (sRGB -> CIELAB, 8 bits per channel).
"""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageCms

from stylevar.images import to_rgb

_SRGB = ImageCms.createProfile("sRGB")
_LAB = ImageCms.createProfile("LAB")
_TO_LAB = ImageCms.buildTransformFromOpenProfiles(_SRGB, _LAB, "RGB", "LAB")
_TO_RGB = ImageCms.buildTransformFromOpenProfiles(_LAB, _SRGB, "LAB", "RGB")


def _lab(img: Image.Image) -> np.ndarray:
    return np.asarray(ImageCms.applyTransform(to_rgb(img), _TO_LAB), dtype=np.float64)


def reinhard_transfer(content: Image.Image, style: Image.Image, eps: float = 1e-6) -> Image.Image:
    """Content with each Lab channel shifted and scaled to the style's mean and standard deviation."""
    c, s = _lab(content), _lab(style)
    c_mean, c_std = c.reshape(-1, 3).mean(0), c.reshape(-1, 3).std(0)
    s_mean, s_std = s.reshape(-1, 3).mean(0), s.reshape(-1, 3).std(0)
    out = (c - c_mean) * (s_std / (c_std + eps)) + s_mean
    lab = Image.fromarray(np.clip(out + 0.5, 0, 255).astype(np.uint8), "LAB")
    return ImageCms.applyTransform(lab, _TO_RGB)
