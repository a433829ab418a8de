"""Style and content loss on torchvision VGG-19 features (the StyleVAR paper's definitions): Gram matrices at
conv1_1 ... conv5_1 for style, conv4_2 for content, on ImageNet-normalised [0, 1] input, pre-ReLU.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from stylevar.loaders import weights
from stylevar.models.state_dict import read_checked

STYLE_LAYERS = (0, 5, 10, 19, 28)  # conv1_1, conv2_1, conv3_1, conv4_1, conv5_1
CONTENT_LAYER = 21  # conv4_2
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def gram_matrix(feat_BCHW: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, C, C) Gram matrix divided by C*H*W."""
    b, c, h, w = feat_BCHW.shape
    f = feat_BCHW.reshape(b, c, h * w)
    return torch.bmm(f, f.transpose(1, 2)) / (c * h * w)


def relative_gram_distance(grams_a: list[torch.Tensor], grams_b: list[torch.Tensor]) -> torch.Tensor:
    """(B,) per pair, the mean over layers of ||G_a - G_b||_F / (||G_a||_F + ||G_b||_F), in [0, 1]."""
    per_layer = [(ga - gb).flatten(1).norm(dim=1)
                 / (ga.flatten(1).norm(dim=1) + gb.flatten(1).norm(dim=1)).clamp_min(1e-12)
                 for ga, gb in zip(grams_a, grams_b)]
    return torch.stack(per_layer).mean(0)


def load_vgg19_features(path: str | os.PathLike | None = None, upto: int = max(STYLE_LAYERS)) -> nn.Sequential:
    """torchvision VGG-19 `features[:upto + 1]` from `weights.resolve("vgg19")`, the whole file checked first."""
    from torchvision.models import vgg19
    path = weights.resolve("vgg19") if path is None else path
    with torch.device("meta"):
        skeleton = vgg19()
    sd = read_checked(path, skeleton.state_dict(), source=f"{path} (torchvision VGG-19)")
    features = skeleton.features[: upto + 1].to_empty(device="cpu")
    prefix = "features."
    own = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix) and int(k.split(".")[1]) <= upto}
    features.load_state_dict(own, strict=True)
    for m in features.modules():
        if isinstance(m, nn.ReLU):
            m.inplace = False
    return features.eval().requires_grad_(False)


class VGGLosses(nn.Module):
    """Style and content loss against VGG-19 features; returns per-image values (B,)."""

    def __init__(self, features: nn.Sequential):
        super().__init__()
        self.features = features
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    @classmethod
    def from_file(cls, path: str | os.PathLike | None = None) -> "VGGLosses":
        return cls(load_vgg19_features(path))

    def taps(self, img_B3HW: torch.Tensor, layers: tuple[int, ...]) -> dict[int, torch.Tensor]:
        """Outputs of the given `features` indices for images in [0, 1]."""
        x = (img_B3HW - self.mean) / self.std
        out: dict[int, torch.Tensor] = {}
        last = max(layers)
        for i, layer in enumerate(self.features):
            x = layer(x)
            if i in layers:
                out[i] = x
            if i == last:
                break
        return out

    def style_loss(self, gen_feats: dict[int, torch.Tensor], style_feats: dict[int, torch.Tensor]) -> torch.Tensor:
        total = 0.0
        for i in STYLE_LAYERS:
            total = total + F.mse_loss(gram_matrix(gen_feats[i]), gram_matrix(style_feats[i]), reduction="none").mean((1, 2))
        return total

    @staticmethod
    def content_loss(gen_feats: dict[int, torch.Tensor], content_feats: dict[int, torch.Tensor]) -> torch.Tensor:
        g, c = gen_feats[CONTENT_LAYER], content_feats[CONTENT_LAYER]
        return F.mse_loss(g, c, reduction="none").mean((1, 2, 3))

    @torch.no_grad()
    def forward(self, generated: torch.Tensor, content: torch.Tensor, style: torch.Tensor) -> dict[str, torch.Tensor]:
        gen = self.taps(generated, STYLE_LAYERS + (CONTENT_LAYER,))
        return {
            "style_loss": self.style_loss(gen, self.taps(style, STYLE_LAYERS)),
            "content_loss": self.content_loss(gen, self.taps(content, (CONTENT_LAYER,))),
        }
