"""Palette matching: the model's drawing moved toward the style's colour statistics.

A small model trained on a few thousand synthetic triplets keeps the content's layout but takes only part
of the style's colours: its first scale's token, which sets the mean colour, is hard to predict, and
sampling errors at the finer scales drift it further (benchmarks/fidelity.md measures both). This step
takes the rest of the way with the statistic that the colour of a style is mostly made of: in CIELAB
(kornia's sRGB -> Lab, D65), each channel of the drawing is shifted and scaled so that its mean and
standard deviation move ``strength`` of the way from the drawing's own toward the style's, the transfer of
Reinhard et al. (2001) applied to the drawing instead of the content. Strength 1 is the full transfer;
0 leaves the drawing untouched. Layout and texture are the model's: an affine map per channel keeps every
edge where it was.

With several styles the drawing is matched to each, and the results are mixed pixel by pixel with each
style's share of the blend (its weight, within its mask), so each region takes its own style's palette;
where no style applies (outside every mask) the drawing stays as drawn.

A model directory's ``config.json`` may carry ``"palette": {"strength": s}``; without it the pipeline
returns the transformer's colours, so published checkpoints compute what the reference computes. The demo
recipe chooses the strength on its training split (`training.demo.choose_palette`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import kornia.color
import torch

from stylevar.config import Serializable
from stylevar.transformer import StyleBlend

_EPS = 1e-4  # Lab units: a flat channel is not divided by zero


@dataclass(frozen=True)
class Palette(Serializable):
    strength: float = 0.0  # 0 = off; 1 = the drawing's Lab mean and std become the style's

    def __post_init__(self) -> None:
        if not (math.isfinite(self.strength) and 0.0 <= self.strength <= 1.0):
            raise ValueError(f"palette strength must lie in [0, 1], got {self.strength}")

    @property
    def enabled(self) -> bool:
        return self.strength > 0


def lab_moments(lab_B3HW: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-image, per-channel mean and standard deviation, each (B, 3, 1, 1)."""
    return lab_B3HW.mean((2, 3), keepdim=True), lab_B3HW.std((2, 3), keepdim=True)


def _matched(lab_B3HW: torch.Tensor, style_B3HW: torch.Tensor, strength: float) -> torch.Tensor:
    """The drawing (Lab) with its moments moved `strength` of the way to the style's (RGB in [0, 1])."""
    mean, std = lab_moments(lab_B3HW)
    s_mean, s_std = lab_moments(kornia.color.rgb_to_lab(style_B3HW))
    new_mean = torch.lerp(mean, s_mean, strength)
    new_std = torch.lerp(std, s_std, strength)
    lab = (lab_B3HW - mean) * (new_std / (std + _EPS)) + new_mean
    return kornia.color.lab_to_rgb(lab).clamp(0, 1)


def match_palette(drawing_B3HW: torch.Tensor, style: torch.Tensor | StyleBlend, cfg: Palette) -> torch.Tensor:
    """`drawing` (in [0, 1]) with the style's palette (module doc). `style` is the model's style input: one
    image batch or a `StyleBlend`, in [-1, 1] at any size. Computed in float32; `drawing` unchanged when
    `cfg` is off."""
    if not cfg.enabled:
        return drawing_B3HW
    x = drawing_B3HW.float().clamp(0, 1)
    lab = kornia.color.rgb_to_lab(x)
    if not isinstance(style, StyleBlend):
        return _matched(lab, style.float().add(1).mul(0.5), cfg.strength).to(drawing_B3HW.dtype)
    shares_BSHW = style.pixel_shares(x.shape[-1])
    out = x * (1 - shares_BSHW.sum(1, keepdim=True))
    for s, share_BHW in zip(style.styles, shares_BSHW.unbind(1)):
        out = out + share_BHW.unsqueeze(1) * _matched(lab, s.float().add(1).mul(0.5), cfg.strength)
    return out.clamp(0, 1).to(drawing_B3HW.dtype)
