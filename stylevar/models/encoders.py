"""Image encoders that condition StyleVAR: the style embedding drives AdaLN, the content embedding is the start
token. Official presets use torchvision's ResNet-18 trunk, the tiny preset a small CNN.
"""
from __future__ import annotations

import torch
import torchvision
from torch import nn


def resnet18_trunk() -> nn.Sequential:
    """ResNet-18 without its pooling and classifier; outputs (B, 512, h, w)."""
    return nn.Sequential(*list(torchvision.models.resnet18(weights=None).children())[:-2])


def small_cnn(out_dim: int) -> nn.Sequential:
    """Four stride-2 conv stages (3 -> 32 -> 64 -> 128 -> out_dim) for CPU-sized models."""
    layers: list[nn.Module] = []
    chans = [3, 32, 64, 128, out_dim]
    for c_in, c_out in zip(chans[:-1], chans[1:]):
        layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1), nn.GroupNorm(8, c_out), nn.SiLU()]
    return nn.Sequential(*layers)


def build_image_encoder(kind: str, out_dim: int) -> nn.Sequential:
    if kind == "resnet18":
        if out_dim != 512:
            raise ValueError("the ResNet-18 encoder has 512 output channels")
        return resnet18_trunk()
    if kind == "cnn":
        return small_cnn(out_dim)
    raise ValueError(f"unknown image encoder {kind!r}")


PALETTE_BINS = 8  # luminance bins of `colour_statistics`' palette
NUM_COLOUR_STATS = 6 + 3 * PALETTE_BINS


def colour_statistics(img_B3HW: torch.Tensor) -> torch.Tensor:
    """Colour statistics (B, NUM_COLOUR_STATS) of images in [-1, 1]: per-channel mean and deviation, then the mean
    colour of each of PALETTE_BINS equal-count luminance bins, dark to light."""
    x_BNc = img_B3HW.float().flatten(2).transpose(1, 2)  # (B, H*W, 3)
    luma_BN = x_BNc @ x_BNc.new_tensor([0.299, 0.587, 0.114])
    order_BN = luma_BN.argsort(dim=1)
    sorted_BNc = x_BNc.gather(1, order_BN.unsqueeze(2).expand_as(x_BNc))
    edges = torch.linspace(0, x_BNc.shape[1], PALETTE_BINS + 1).round().long().tolist()
    ramp = [sorted_BNc[:, a:max(b, a + 1)].mean(1) for a, b in zip(edges[:-1], edges[1:])]
    moments = [x_BNc.mean(1), x_BNc.std(1, unbiased=False)]
    return torch.cat(moments + ramp, dim=1).to(img_B3HW.dtype)


def pooled(encoder: nn.Module, img_B3HW: torch.Tensor) -> torch.Tensor:
    """Global-average-pooled embedding (B, D) of images in [-1, 1] (no ImageNet normalisation)."""
    return encoder(img_B3HW).mean(dim=(2, 3))
