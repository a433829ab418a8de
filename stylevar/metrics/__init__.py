"""Evaluation metrics of the StyleVAR paper: style / content loss (VGG-19), LPIPS, SSIM, DreamSim, CLIP.

Images are float tensors (B, 3, H, W) in [0, 1], resized to 256 x 256. See docs/metrics.md for the
exact definitions. `compute` loads the model it needs on every call; use `MetricSuite` to load each
model once and evaluate many batches. Their names, references and weights: `stylevar.metric_definitions`.
"""
from __future__ import annotations

import torch

from stylevar.metrics.suite import MetricSuite

__all__ = ["MetricSuite", "compute"]


def compute(
    name: str,
    generated: torch.Tensor,
    content: torch.Tensor,
    style: torch.Tensor,
    target: torch.Tensor | None = None,
    *,
    device: str | torch.device | None = None,
    lpips_net: str = "vgg",
) -> torch.Tensor:
    """One metric per image: (B,). With `target` the pairwise metrics compare to it, else to `content`."""
    suite = MetricSuite((name,), device=device, lpips_net=lpips_net)
    return suite(generated, content, style, target)[name]
