"""Reinhard et al. (2001) colour transfer: the content recoloured to the style's Lab mean and std.

A weight-free baseline: it moves colour statistics and nothing else (Lab through PIL's ImageCms).
"""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageCms

from stylevar.processing.images import to_rgb

_SRGB = ImageCms.createProfile("sRGB")
_LAB = ImageCms.createProfile("LAB")
_TO_LAB = ImageCms.buildTransformFromOpenProfiles(_SRGB, _LAB, "RGB", "LAB")
_TO_RGB = ImageCms.buildTransformFromOpenProfiles(_LAB, _SRGB, "LAB", "RGB")


def _lab(img: Image.Image) -> np.ndarray:
    """(H, W, 3) float: L in [0, 255], a and b signed (Pillow's LAB bytes hold them as int8)."""
    raw = np.asarray(ImageCms.applyTransform(to_rgb(img), _TO_LAB), dtype=np.uint8)
    lab = raw.astype(np.float64)
    lab[..., 1:] = raw[..., 1:].view(np.int8)
    return lab


def _from_lab(lab: np.ndarray) -> Image.Image:
    """Inverse of `_lab`: clipped to the byte ranges, a and b written back as int8."""
    raw = np.empty(lab.shape, dtype=np.uint8)
    raw[..., 0] = np.clip(lab[..., 0] + 0.5, 0, 255).astype(np.uint8)
    raw[..., 1:] = np.clip(np.round(lab[..., 1:]), -128, 127).astype(np.int8).view(np.uint8)
    return ImageCms.applyTransform(Image.fromarray(raw, "LAB"), _TO_RGB)


def reinhard_transfer(content: Image.Image, style: Image.Image, eps: float = 1e-6) -> Image.Image:
    """Content with each Lab channel shifted and scaled to the style's mean and standard deviation."""
    c, s = _lab(content), _lab(style)
    c_mean, c_std = c.reshape(-1, 3).mean(0), c.reshape(-1, 3).std(0)
    s_mean, s_std = s.reshape(-1, 3).mean(0), s.reshape(-1, 3).std(0)
    return _from_lab((c - c_mean) * (s_std / (c_std + eps)) + s_mean)
