"""How much of the style an image took, without downloaded weights: its colours and its texture.

`colour_swd(a, b)`: the sliced Wasserstein distance of the two images' CIELAB pixels; `texture_distance(a, b)`:
the relative Gram distance of a fixed random conv net's features, in [0, 1]. Both give a value per pair, (B,).
"""
from __future__ import annotations

import functools

import kornia.color
import torch
import torch.nn.functional as F
from torch import nn

from stylevar.metrics.vgg import gram_matrix, relative_gram_distance
from stylevar.processing.upsample import luminance

QUANTILES = 256
PROJECTIONS = 64
TEXTURE_SEED = 1234


def _check_pair(a: torch.Tensor, b: torch.Tensor) -> None:
    for x in (a, b):
        if x.ndim != 4 or x.shape[1] != 3:
            raise ValueError(f"expected (B, 3, H, W) images, got {tuple(x.shape)}")
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"batches differ: {a.shape[0]} and {b.shape[0]} images")


def _directions(n: int, device: torch.device) -> torch.Tensor:
    """(3, n) unit vectors, the same on every call and machine."""
    g = torch.Generator().manual_seed(0)
    d = torch.randn(3, n, generator=g)
    return (d / d.norm(dim=0, keepdim=True)).to(device)


def _lab_points(img_B3HW: torch.Tensor) -> torch.Tensor:
    """(B, H*W, 3) Lab pixels / 100."""
    return kornia.color.rgb_to_lab(img_B3HW.float().clamp(0, 1)).flatten(2).transpose(1, 2) / 100


def _quantiles(proj_BNP: torch.Tensor) -> torch.Tensor:
    """(B, QUANTILES, P): each projection's quantile function at QUANTILES evenly spaced levels."""
    levels = torch.linspace(0, 1, QUANTILES, device=proj_BNP.device)
    return torch.quantile(proj_BNP, levels, dim=1).permute(1, 0, 2)


def colour_swd(a_B3HW: torch.Tensor, b_B3HW: torch.Tensor, projections: int = PROJECTIONS) -> torch.Tensor:
    """Sliced Wasserstein-1 distance of the two images' Lab colour distributions, per pair (module doc)."""
    _check_pair(a_B3HW, b_B3HW)
    d_3P = _directions(projections, a_B3HW.device)
    qa, qb = (_quantiles(_lab_points(x) @ d_3P) for x in (a_B3HW, b_B3HW))
    return (qa - qb).abs().mean(dim=(1, 2))


class TextureNet(nn.Module):
    """Three random 3 x 3 conv + ReLU layers, never trained (weights from `seed`); returns every layer's features."""

    def __init__(self, seed: int = TEXTURE_SEED, widths: tuple[int, ...] = (16, 32, 64)):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.convs = nn.ModuleList()
        c_in = 1
        for c_out in widths:
            conv = nn.Conv2d(c_in, c_out, 3, padding=1, padding_mode="reflect")
            with torch.no_grad():
                conv.weight.copy_(torch.randn(conv.weight.shape, generator=g) * (2 / (9 * c_in)) ** 0.5)
                conv.bias.zero_()
            self.convs.append(conv)
            c_in = c_out
        self.requires_grad_(False).eval()

    def forward(self, x_B1HW: torch.Tensor) -> list[torch.Tensor]:
        feats = []
        for i, conv in enumerate(self.convs):
            if i:
                x_B1HW = F.avg_pool2d(x_B1HW, 2)
            x_B1HW = F.relu(conv(x_B1HW))
            feats.append(x_B1HW)
        return feats


@functools.lru_cache(maxsize=4)
def texture_net(device: str = "cpu") -> TextureNet:
    return TextureNet().to(device)


def _normalised_luma(img_B3HW: torch.Tensor) -> torch.Tensor:
    y = luminance(img_B3HW.float())
    return (y - y.mean(dim=(2, 3), keepdim=True)) / y.std(dim=(2, 3), keepdim=True).clamp_min(1e-3)


def _grams(img_B3HW: torch.Tensor) -> list[torch.Tensor]:
    feats = texture_net(str(img_B3HW.device))(_normalised_luma(img_B3HW))
    return [gram_matrix(f) for f in feats]  # (B, C, C) each


@torch.no_grad()
def texture_distance(a_B3HW: torch.Tensor, b_B3HW: torch.Tensor) -> torch.Tensor:
    """Relative distance of random-conv Gram matrices of the two images' normalised luminance (module doc)."""
    _check_pair(a_B3HW, b_B3HW)
    return relative_gram_distance(_grams(a_B3HW), _grams(b_B3HW))
