"""AdaIN baseline (Huang & Belongie 2017): VGG-19 encoder to relu4_1, adaptive instance normalisation, the standard
AdaIN decoder; `alpha` blends the normalised features with the content features. Encoders: `vgg_normalised` (the
public `decoder.pth`'s) and `torchvision` (the paper's, "adain-paper"). Images (B, 3, H, W) in [0, 1], sides
multiples of 8.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from stylevar.loaders import weights
from stylevar.models.state_dict import load_into

EncoderKind = Literal["vgg_normalised", "torchvision"]
EPS = 1e-5
RELU4_1_VGG_NORMALISED = 31  # modules [0, 31) of the vgg_normalised layout
RELU4_1_TORCHVISION = 21  # torchvision features[:21]

# (in, out) per 3x3 conv, "M" = 2x2 max pool (ceil mode): VGG-19 from conv1_1 to conv5_4
_VGG19_CONVS: list[tuple[int, int] | str] = [
    (3, 64), (64, 64), "M",
    (64, 128), (128, 128), "M",
    (128, 256), (256, 256), (256, 256), (256, 256), "M",
    (256, 512), (512, 512), (512, 512), (512, 512), "M",
    (512, 512), (512, 512), (512, 512), (512, 512),
]
# decoder: (in, out) per 3x3 conv (reflection padding, ReLU except after the last), "U" = nearest x2 upsampling
_DECODER_CONVS: list[tuple[int, int] | str] = [
    (512, 256), "U",
    (256, 256), (256, 256), (256, 256), (256, 128), "U",
    (128, 128), (128, 64), "U",
    (64, 64), (64, 3),
]

LABELS = {
    "vgg_normalised": "AdaIN",
    "torchvision": "AdaIN (paper eval: torchvision VGG-19, unnormalised input)",
}


def vgg_normalised_layers() -> nn.Sequential:
    """The full torch7-converted VGG-19 layout of `vgg_normalised.pth` (53 modules, to relu5_4)."""
    layers: list[nn.Module] = [nn.Conv2d(3, 3, 1)]
    for spec in _VGG19_CONVS:
        if spec == "M":
            layers.append(nn.MaxPool2d(2, 2, ceil_mode=True))
        else:
            cin, cout = spec
            layers += [nn.ReflectionPad2d(1), nn.Conv2d(cin, cout, 3), nn.ReLU()]
    return nn.Sequential(*layers)


def decoder_layers() -> nn.Sequential:
    """The standard AdaIN decoder layout of `decoder.pth` (relu4_1 features -> RGB)."""
    layers: list[nn.Module] = []
    for i, spec in enumerate(_DECODER_CONVS):
        if spec == "U":
            layers.append(nn.Upsample(scale_factor=2, mode="nearest"))
            continue
        cin, cout = spec
        layers += [nn.ReflectionPad2d(1), nn.Conv2d(cin, cout, 3)]
        if i < len(_DECODER_CONVS) - 1:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def channel_mean_std(feat_BCHW: torch.Tensor, eps: float = EPS, unbiased: bool = True
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std, each (B, C, 1, 1); ``unbiased``: the variance divides by n - 1, else n."""
    b, c = feat_BCHW.shape[:2]
    flat = feat_BCHW.reshape(b, c, -1)
    mean = flat.mean(2).view(b, c, 1, 1)
    std = (flat.var(2, unbiased=unbiased) + eps).sqrt().view(b, c, 1, 1)
    return mean, std


def adaptive_instance_norm(content_BCHW: torch.Tensor, style_BCHW: torch.Tensor, eps: float = EPS,
                           unbiased: bool = True) -> torch.Tensor:
    """Content features re-normalised to the style features' per-channel mean and std."""
    if content_BCHW.shape[:2] != style_BCHW.shape[:2]:
        raise ValueError(f"content features {tuple(content_BCHW.shape)} and style features "
                         f"{tuple(style_BCHW.shape)} differ in batch or channels")
    c_mean, c_std = channel_mean_std(content_BCHW, eps, unbiased)
    s_mean, s_std = channel_mean_std(style_BCHW, eps, unbiased)
    return (content_BCHW - c_mean) / c_std * s_std + s_mean


def load_vgg_normalised(path: str | os.PathLike) -> nn.Sequential:
    """`vgg_normalised.pth` (full layout checked) cut to relu4_1."""
    full = vgg_normalised_layers()
    load_into(full, path, source=f"{path} (AdaIN vgg_normalised)")
    return full[:RELU4_1_VGG_NORMALISED]


def load_torchvision_vgg19(path: str | os.PathLike | None = None) -> nn.Sequential:
    """torchvision VGG-19 `features[:21]` (to relu4_1) from the torchvision file."""
    from stylevar.metrics.vgg import load_vgg19_features
    return load_vgg19_features(path, upto=RELU4_1_TORCHVISION - 1)


def load_decoder(path: str | os.PathLike) -> nn.Sequential:
    decoder = decoder_layers()
    load_into(decoder, path, source=f"{path} (AdaIN decoder)")
    return decoder


class AdaIN(nn.Module):
    def __init__(self, encoder: nn.Sequential, decoder: nn.Sequential, encoder_kind: EncoderKind):
        super().__init__()
        if encoder_kind not in LABELS:
            raise ValueError(f"encoder_kind must be one of {tuple(LABELS)}, not {encoder_kind!r}")
        self.encoder = encoder.eval().requires_grad_(False)
        self.decoder = decoder.eval().requires_grad_(False)
        self.encoder_kind = encoder_kind

    @property
    def label(self) -> str:
        return LABELS[self.encoder_kind]

    @classmethod
    def from_files(cls, decoder: str | os.PathLike, encoder: str | os.PathLike = "torchvision", *,
                   torchvision_weights: str | os.PathLike | None = None) -> "AdaIN":
        """`encoder`: a path to `vgg_normalised.pth`, or "torchvision" (the paper's evaluation setting)."""
        if isinstance(encoder, str) and encoder == "torchvision":
            return cls(load_torchvision_vgg19(torchvision_weights), load_decoder(decoder), "torchvision")
        if not Path(encoder).is_file():
            raise FileNotFoundError(f"AdaIN encoder file not found: {encoder} (or pass encoder='torchvision')")
        return cls(load_vgg_normalised(encoder), load_decoder(decoder), "vgg_normalised")

    @classmethod
    def from_registry(cls, encoder: EncoderKind = "vgg_normalised") -> "AdaIN":
        """Load from the weight cache: `adain_decoder` with `adain_vgg` (or `vgg19` for "torchvision")."""
        decoder = weights.resolve("adain_decoder")
        if encoder == "torchvision":
            return cls.from_files(decoder, "torchvision")
        if encoder != "vgg_normalised":
            raise ValueError(f"encoder must be 'vgg_normalised' or 'torchvision', not {encoder!r}")
        return cls.from_files(decoder, weights.resolve("adain_vgg"))

    def encode(self, img_B3HW: torch.Tensor) -> torch.Tensor:
        """relu4_1 features (B, 512, H/8, W/8) of images in [0, 1]."""
        return self.encoder(img_B3HW)

    def decode(self, feat_B512hw: torch.Tensor) -> torch.Tensor:
        """Decoder output (not clamped)."""
        return self.decoder(feat_B512hw)

    @torch.no_grad()
    def stylize(self, content: torch.Tensor, style: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        """Stylised images (B, 3, H, W) in [0, 1]. `style` may have batch size 1 (shared) or B."""
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
        for name, x in (("content", content), ("style", style)):
            if x.ndim != 4 or x.shape[1] != 3:
                raise ValueError(f"{name}: expected (B, 3, H, W), got {tuple(x.shape)}")
        f_c, f_s = self.encode(content), self.encode(style)
        if f_s.shape[0] == 1 and f_c.shape[0] > 1:
            f_s = f_s.expand(f_c.shape[0], -1, -1, -1)
        # the paper's evaluation ("torchvision") normalises with the biased variance, the AdaIN code unbiased
        t = adaptive_instance_norm(f_c, f_s, unbiased=self.encoder_kind == "vgg_normalised")
        t = alpha * t + (1 - alpha) * f_c
        return self.decode(t).clamp(0, 1)
