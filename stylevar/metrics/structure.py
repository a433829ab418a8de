"""Structure kept from the content: `ssim` as the StyleVAR paper's evaluation computes it (zero-padded),
`ssim_standard` (torchmetrics' "valid" SSIM) and `edge_correlation(a, b)`, how the two images' edges agree.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from stylevar.processing.upsample import luminance

WINDOW = 11
SIGMA = 1.5
C1 = 0.01**2
C2 = 0.03**2


def gaussian_window(size: int = WINDOW, sigma: float = SIGMA, dtype=torch.float32, device=None) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float64, device=device) - (size - 1) / 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    g = g / g.sum()
    return torch.outer(g, g).to(dtype)


def ssim(x_B3HW: torch.Tensor, y_B3HW: torch.Tensor) -> torch.Tensor:
    """Paper SSIM (zero-padded, same-size map) per image: (B,). Inputs in [0, 1]."""
    if x_B3HW.shape != y_B3HW.shape or x_B3HW.ndim != 4:
        raise ValueError(f"ssim needs two (B, C, H, W) tensors of one shape, got {tuple(x_B3HW.shape)} and {tuple(y_B3HW.shape)}")
    c = x_B3HW.shape[1]
    w = gaussian_window(dtype=x_B3HW.dtype, device=x_B3HW.device).expand(c, 1, WINDOW, WINDOW)

    def blur(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t, w, padding=WINDOW // 2, groups=c)

    mu_x, mu_y = blur(x_B3HW), blur(y_B3HW)
    var_x = blur(x_B3HW * x_B3HW) - mu_x**2
    var_y = blur(y_B3HW * y_B3HW) - mu_y**2
    cov = blur(x_B3HW * y_B3HW) - mu_x * mu_y
    ssim_map = ((2 * mu_x * mu_y + C1) * (2 * cov + C2)) / ((mu_x**2 + mu_y**2 + C1) * (var_x + var_y + C2))
    return ssim_map.mean((1, 2, 3))


def ssim_standard(x_B3HW: torch.Tensor, y_B3HW: torch.Tensor) -> torch.Tensor:
    """Valid-region SSIM from torchmetrics, per image: (B,). Inputs in [0, 1]."""
    from torchmetrics.functional.image import structural_similarity_index_measure
    out = structural_similarity_index_measure(
        x_B3HW, y_B3HW, gaussian_kernel=True, sigma=SIGMA, kernel_size=WINDOW, data_range=1.0,
        k1=0.01, k2=0.03, reduction="none",
    )
    return out.reshape(-1)



def sobel_magnitude(img_B3HW: torch.Tensor) -> torch.Tensor:
    """|grad| of the luminance, (B, H, W), images in [0, 1]."""
    if img_B3HW.ndim != 4 or img_B3HW.shape[1] != 3:
        raise ValueError(f"expected (B, 3, H, W) images, got {tuple(img_B3HW.shape)}")
    y_B1HW = luminance(img_B3HW)
    kx = torch.tensor([[1.0, 0.0, -1.0], [2.0, 0.0, -2.0], [1.0, 0.0, -1.0]], dtype=img_B3HW.dtype,
                      device=img_B3HW.device)
    k_2133 = torch.stack([kx, kx.T]).unsqueeze(1)
    g_B2HW = F.conv2d(F.pad(y_B1HW, (1, 1, 1, 1), mode="replicate"), k_2133)
    return g_B2HW.pow(2).sum(1).sqrt()


def edge_correlation(a_B3HW: torch.Tensor, b_B3HW: torch.Tensor) -> torch.Tensor:
    """Pearson correlation of the two images' Sobel magnitudes (in [0, 1]), per pair: (B,); a flat image scores 0."""
    if a_B3HW.shape != b_B3HW.shape:
        raise ValueError(f"edge_correlation needs images of one shape, got {tuple(a_B3HW.shape)} and "
                         f"{tuple(b_B3HW.shape)}")
    ga = sobel_magnitude(a_B3HW.float()).flatten(1)
    gb = sobel_magnitude(b_B3HW.float()).flatten(1)
    ga, gb = ga - ga.mean(1, keepdim=True), gb - gb.mean(1, keepdim=True)
    denom = ga.norm(dim=1) * gb.norm(dim=1)
    return torch.where(denom > 1e-12, (ga * gb).sum(1) / denom.clamp_min(1e-12), torch.zeros_like(denom))
