"""How much each scale's tokens weigh in a loss over all K token maps.

Per-action normalization weighting (PANW) weighs a token of scale k by (h_k * w_k)^-gamma: gamma 0 is the plain
mean (the finest scale takes almost all of the gradient), gamma 1 gives every scale the same share.
"""
from __future__ import annotations

from typing import Sequence

import torch


def panw_weights(patch_nums: Sequence[int], gamma: float = 0.7) -> torch.Tensor:
    """Per-token weights (L,): a token of scale k weighs (h_k * w_k)^-gamma / Z, sum 1 over all tokens."""
    if gamma < 0:
        raise ValueError(f"PANW gamma must be >= 0, got {gamma}")
    per_token = torch.cat([torch.full((pn * pn,), float(pn * pn) ** -gamma, dtype=torch.float64) for pn in patch_nums])
    return (per_token / per_token.sum()).float()
