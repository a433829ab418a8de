"""The metrics of `stylevar.metrics`: their names, what each is compared against, which way is better and which
weights it needs. Importing it does not import torch: `stylevar evaluate --help` reads it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Reference = Literal["style", "content", "target_or_content"]


@dataclass(frozen=True)
class MetricInfo:
    name: str
    label: str  # column title, as in the paper's Table 1
    higher_is_better: bool
    reference: Reference  # what the generated image is compared with
    weights: tuple[str, ...]  # registry names (LPIPS: the default VGG backbone; see `weights_for`)
    extra: str = ""  # the optional install it needs instead of weights ("teacher": the pretrained style network)


METRICS: dict[str, MetricInfo] = {
    m.name: m
    for m in (
        MetricInfo("style_loss", "Style Loss", False, "style", ("vgg19",)),
        MetricInfo("content_loss", "Content Loss", False, "content", ("vgg19",)),
        MetricInfo("lpips", "LPIPS", False, "target_or_content", ("vgg16",)),
        MetricInfo("ssim", "SSIM", True, "target_or_content", ()),
        MetricInfo("ssim_standard", "SSIM (valid)", True, "target_or_content", ()),
        MetricInfo("dreamsim", "DreamSim", False, "target_or_content", ("dreamsim",)),
        MetricInfo("clip", "CLIP Sim.", True, "target_or_content", ("clip",)),
        # beyond the paper: how much of the style a pretrained network sees, and the detail kept
        MetricInfo("style_cosine", "Style-vector cos.", True, "style", (), extra="teacher"),
        MetricInfo("style_gram", "Pretrained Gram dist.", False, "style", (), extra="teacher"),
        MetricInfo("sharpness", "Sharpness", True, "content", ()),
    )
}
NAMES = tuple(METRICS)
PAPER_METRICS = ("style_loss", "content_loss", "lpips", "ssim", "dreamsim", "clip")


def weights_for(name: str, lpips_net: str = "vgg") -> tuple[str, ...]:
    """Registry names of the weights metric `name` needs."""
    info = get(name)
    if name == "lpips":
        from stylevar.metrics.perceptual import LPIPS_WEIGHTS

        if lpips_net not in LPIPS_WEIGHTS:
            raise ValueError(f"LPIPS backbone must be one of {tuple(LPIPS_WEIGHTS)}, not {lpips_net!r}")
        return (LPIPS_WEIGHTS[lpips_net],)
    return info.weights


def get(name: str) -> MetricInfo:
    try:
        return METRICS[name]
    except KeyError:
        raise ValueError(f"unknown metric {name!r}; choose from {', '.join(NAMES)}") from None
