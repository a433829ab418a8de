"""Palette matching: the model's drawing moved toward the style's colours, layout and edges kept.

``method="moments"``: each CIELAB channel's mean and deviation moved ``strength`` of the way toward the style's
(Reinhard et al. 2001); ``method="distribution"``: Pitie, Kokaram and Dahyot's (2005) iterative distribution
transfer in CIELAB. With several styles each region takes its own style's. Off unless config.json's ``"palette"``.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import kornia.color
import numpy as np
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


def _quantiles(x_BNA: torch.Tensor, levels_Q: torch.Tensor) -> torch.Tensor:
    """Each axis' quantiles at ``levels`` (A, B, Q), as `torch.quantile` gives them, from one sort."""
    x_BAN = x_BNA.transpose(1, 2).float().contiguous()
    if x_BAN.device.type == "cpu":
        sorted_BAN = torch.from_numpy(np.sort(x_BAN.numpy(), axis=-1))
    else:
        sorted_BAN = x_BAN.sort(dim=-1).values
    ranks_Q = levels_Q * (x_BNA.shape[1] - 1)
    below, above = ranks_Q.long(), ranks_Q.ceil().long()
    low_BAQ = sorted_BAN.index_select(-1, below)
    return low_BAQ.lerp_(sorted_BAN.index_select(-1, above), ranks_Q - below).permute(1, 0, 2)


def _distribution_matched(lab_B3HW: torch.Tensor, style_lab_B3HW: torch.Tensor, strength: float,
                          iterations: int) -> torch.Tensor:
    """The drawing (Lab) through the iterative distribution transfer toward the style's colours (module doc)."""
    x_BN3 = lab_B3HW.flatten(2).transpose(1, 2)
    y_BM3 = style_lab_B3HW.flatten(2).transpose(1, 2)
    B, N, _ = x_BN3.shape
    levels = torch.linspace(0, 1, _QUANTILES, device=x_BN3.device)
    bases = [R.to(x_BN3.device) for R in _rotations(iterations)]
    # the style's quantiles on every basis, sorted at once: (3 * iterations, B, Q)
    qy_XBQ = _quantiles(torch.cat([y_BM3 @ R for R in bases], 2), levels)
    out_BN3 = x_BN3
    for i, R in enumerate(bases):
        px_BN3 = out_BN3 @ R
        # strictly increasing knots: a flat run of quantiles (a constant region) gets a tiny slope
        qx_3BQ = _quantiles(px_BN3, levels) + levels * 1e-4
        mapped_3BN = _interp(px_BN3.permute(2, 0, 1).reshape(3 * B, N), qx_3BQ.reshape(3 * B, -1),
                             qy_XBQ[3 * i:3 * i + 3].reshape(3 * B, -1)).view(3, B, N)
        out_BN3 = mapped_3BN.permute(1, 2, 0) @ R.T
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
    """`drawing` (in [0, 1]) with the palette of `style` (the model's style input); unchanged when `cfg` is off."""
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
