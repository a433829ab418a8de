"""Structure kept from the content: `edge_correlation(a, b)`, the Pearson correlation of the two images' Sobel
gradient magnitudes (on luminance), per pair. Callers compare at the model's working resolution.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

_LUMA = (0.299, 0.587, 0.114)


def sobel_magnitude(img_B3HW: torch.Tensor) -> torch.Tensor:
    """|grad| of the luminance, (B, H, W), images in [0, 1]."""
    if img_B3HW.ndim != 4 or img_B3HW.shape[1] != 3:
        raise ValueError(f"expected (B, 3, H, W) images, got {tuple(img_B3HW.shape)}")
    luma = torch.tensor(_LUMA, dtype=img_B3HW.dtype, device=img_B3HW.device).view(1, 3, 1, 1)
    y_B1HW = (img_B3HW * luma).sum(1, keepdim=True)
    kx = torch.tensor([[1.0, 0.0, -1.0], [2.0, 0.0, -2.0], [1.0, 0.0, -1.0]], dtype=img_B3HW.dtype,
                      device=img_B3HW.device)
    k_2133 = torch.stack([kx, kx.T]).unsqueeze(1)
    g_B2HW = F.conv2d(F.pad(y_B1HW, (1, 1, 1, 1), mode="replicate"), k_2133)
    return g_B2HW.pow(2).sum(1).sqrt()


def edge_correlation(a_B3HW: torch.Tensor, b_B3HW: torch.Tensor) -> torch.Tensor:
    """Pearson correlation of the two images' Sobel magnitudes, per pair: (B,). Images in [0, 1].

    A flat image (no edges at all) has no defined correlation; it scores 0.
    """
    if a_B3HW.shape != b_B3HW.shape:
        raise ValueError(f"edge_correlation needs images of one shape, got {tuple(a_B3HW.shape)} and "
                         f"{tuple(b_B3HW.shape)}")
    ga = sobel_magnitude(a_B3HW.float()).flatten(1)
    gb = sobel_magnitude(b_B3HW.float()).flatten(1)
    ga, gb = ga - ga.mean(1, keepdim=True), gb - gb.mean(1, keepdim=True)
    denom = ga.norm(dim=1) * gb.norm(dim=1)
    return torch.where(denom > 1e-12, (ga * gb).sum(1) / denom.clamp_min(1e-12), torch.zeros_like(denom))
