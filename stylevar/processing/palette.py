"""Palette matching: the model's drawing moved toward the style's colours.

A small model trained on a few thousand synthetic triplets keeps the content's layout but takes only part
of the style's colours: its first scale's token, which sets the mean colour, is hard to predict, and
sampling errors at the finer scales drift it further (benchmarks/fidelity.md measures both). This step
takes the rest of the way with the statistic that the colour of a style is mostly made of: in CIELAB
(kornia's sRGB -> Lab, D65), each channel of the drawing is shifted and scaled so that its mean and
standard deviation move ``strength`` of the way from the drawing's own toward the style's, the transfer of
Reinhard et al. (2001) applied to the drawing instead of the content. Strength 1 is the full transfer;
0 leaves the drawing untouched. Layout and texture are the model's: an affine map per channel keeps every
edge where it was.

``method="distribution"`` matches the whole colour distribution instead of two moments: the iterative
distribution transfer of Pitie, Kokaram and Dahyot (ICCV 2005) in CIELAB. Each of ``iterations`` rounds
projects the drawing's and the style's pixels on a fixed orthonormal basis (the first round on the Lab
axes, then rotations drawn from a fixed seed, so the step is deterministic), maps each projected axis
through the monotone piecewise-linear function that sends the drawing's quantiles to the style's, and
rotates back. Equal colours stay equal (a map of values, not of ranks), so flat regions stay flat and
every edge stays where it was; the result's sliced Wasserstein distance to the style's colours goes to
about zero as the rounds grow. ``strength`` mixes the drawing (0) with the transferred drawing (1) in Lab.

With several styles the drawing is matched to each, and the results are mixed pixel by pixel with each
style's share of the blend (its weight, within its mask), so each region takes its own style's palette;
where no style applies (outside every mask) the drawing stays as drawn.

A model directory's ``config.json`` may carry ``"palette": {"strength": s, "method": m}``; without it the pipeline
returns the transformer's colours, so published checkpoints compute what the reference computes. The demo
recipe chooses the strength on its training split (`training.parts.demo_export.choose_palette`).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import kornia.color
import torch

from stylevar.config import Serializable
from stylevar.models.transformer import StyleBlend

_EPS = 1e-4  # Lab units: a flat channel is not divided by zero
_QUANTILES = 64  # knots of each axis' transfer function
_ROTATION_SEED = 20050101  # the distribution transfer's fixed rotations

PaletteMethod = Literal["moments", "distribution"]


@dataclass(frozen=True)
class Palette(Serializable):
    strength: float = 0.0  # 0 = off; 1 = the full transfer of `method`
    method: PaletteMethod = "moments"  # Lab mean and std (Reinhard) or the whole distribution (module doc)
    iterations: int = 6  # rounds of the distribution transfer

    def __post_init__(self) -> None:
        if not (math.isfinite(self.strength) and 0.0 <= self.strength <= 1.0):
            raise ValueError(f"palette strength must lie in [0, 1], got {self.strength}")
        if self.method not in ("moments", "distribution"):
            raise ValueError(f"palette method must be 'moments' or 'distribution', got {self.method!r}")
        if not 1 <= self.iterations <= 64:
            raise ValueError(f"palette iterations must lie in [1, 64], got {self.iterations}")

    @property
    def enabled(self) -> bool:
        return self.strength > 0


def lab_moments(lab_B3HW: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-image, per-channel mean and standard deviation, each (B, 3, 1, 1)."""
    return lab_B3HW.mean((2, 3), keepdim=True), lab_B3HW.std((2, 3), keepdim=True)


def _moments_matched(lab_B3HW: torch.Tensor, style_lab_B3HW: torch.Tensor, strength: float) -> torch.Tensor:
    """The drawing (Lab) with its moments moved `strength` of the way to the style's."""
    mean, std = lab_moments(lab_B3HW)
    s_mean, s_std = lab_moments(style_lab_B3HW)
    new_mean = torch.lerp(mean, s_mean, strength)
    new_std = torch.lerp(std, s_std, strength)
    return (lab_B3HW - mean) * (new_std / (std + _EPS)) + new_mean


def _interp(x_BN: torch.Tensor, knots_BQ: torch.Tensor, values_BQ: torch.Tensor) -> torch.Tensor:
    """Row-wise piecewise-linear interpolation through increasing ``knots`` (constant beyond the ends)."""
    Q = knots_BQ.shape[1]
    right_BN = torch.searchsorted(knots_BQ.contiguous(), x_BN.contiguous()).clamp(1, Q - 1)
    x0, x1 = knots_BQ.gather(1, right_BN - 1), knots_BQ.gather(1, right_BN)
    y0, y1 = values_BQ.gather(1, right_BN - 1), values_BQ.gather(1, right_BN)
    t = ((x_BN - x0) / (x1 - x0).clamp_min(1e-6)).clamp(0, 1)
    return y0 + t * (y1 - y0)


@functools.cache
def _rotations(iterations: int) -> tuple[torch.Tensor, ...]:
    """The transfer's bases (3, 3): the Lab axes, then fixed random orthonormal ones (made once per count)."""
    g = torch.Generator().manual_seed(_ROTATION_SEED)
    return (torch.eye(3), *(torch.linalg.qr(torch.randn(3, 3, generator=g))[0] for _ in range(iterations - 1)))


def _distribution_matched(lab_B3HW: torch.Tensor, style_lab_B3HW: torch.Tensor, strength: float,
                          iterations: int) -> torch.Tensor:
    """The drawing (Lab) through the iterative distribution transfer toward the style's colours (module doc)."""
    x_BN3 = lab_B3HW.flatten(2).transpose(1, 2)
    y_BM3 = style_lab_B3HW.flatten(2).transpose(1, 2)
    levels = torch.linspace(0, 1, _QUANTILES, device=x_BN3.device)
    out_BN3 = x_BN3
    for R in _rotations(iterations):
        R = R.to(x_BN3.device)
        px_BN3, py_BM3 = out_BN3 @ R, y_BM3 @ R
        qx_3BQ = torch.quantile(px_BN3, levels, dim=1).permute(2, 1, 0)  # per axis: (B, Q)
        qy_3BQ = torch.quantile(py_BM3, levels, dim=1).permute(2, 1, 0)
        # strictly increasing knots: a flat run of quantiles (a constant region) gets a tiny slope
        qx_3BQ = qx_3BQ + levels * 1e-4
        mapped = [_interp(px_BN3[..., a], qx_3BQ[a], qy_3BQ[a]) for a in range(3)]
        out_BN3 = torch.stack(mapped, 2) @ R.T
    out_BN3 = torch.lerp(x_BN3, out_BN3, strength)
    return out_BN3.transpose(1, 2).reshape(lab_B3HW.shape)


def _matched(lab_B3HW: torch.Tensor, style_B3HW: torch.Tensor, cfg: Palette) -> torch.Tensor:
    """The drawing (Lab) with `cfg`'s transfer toward the style (RGB in [0, 1]), back in RGB."""
    style_lab = kornia.color.rgb_to_lab(style_B3HW)
    if cfg.method == "distribution":
        lab = _distribution_matched(lab_B3HW, style_lab, cfg.strength, cfg.iterations)
    else:
        lab = _moments_matched(lab_B3HW, style_lab, cfg.strength)
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
        return _matched(lab, style.float().add(1).mul(0.5), cfg).to(drawing_B3HW.dtype)
    shares_BSHW = style.pixel_shares(x.shape[-1])
    out = x * (1 - shares_BSHW.sum(1, keepdim=True))
    for s, share_BHW in zip(style.styles, shares_BSHW.unbind(1)):
        out = out + share_BHW.unsqueeze(1) * _matched(lab, s.float().add(1).mul(0.5), cfg)
    return out.clamp(0, 1).to(drawing_B3HW.dtype)
