"""Image encoders that condition StyleVAR: the style embedding drives AdaLN, the content embedding is the
start token. Official presets use torchvision's ResNet-18 trunk (module names as in the published
checkpoints: `0` conv1, `1` bn1, `4`..`7` layer1..4); the tiny preset uses a small CNN.
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


def pooled(encoder: nn.Module, img_B3HW: torch.Tensor) -> torch.Tensor:
    """Global-average-pooled embedding (B, D) of images in [-1, 1] (no ImageNet normalisation)."""
    return encoder(img_B3HW).mean(dim=(2, 3))
