"""From the model's resolution to the size the user gets back (the content's size, or `max_side`).

``mode="bicubic"``: the drawing resized. ``mode="guided"``: the drawing resized plus the content's fine detail,
weighted by a guided filter fitted at the model's resolution (He, Sun and Tang):
out_c = up(p)_c + strength * up(a_c) * (Y_full - up(Y_low)). Computed in strips, so memory stays bounded.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps

from stylevar.config import Serializable
from stylevar.processing.images import Fit, result_size, tensor_to_pil, to_levels, unfit
from stylevar.processing.postprocess import DEFAULT_UPSAMPLE, UPSAMPLE_MODES, UpsampleMode

_LUMA = (0.299, 0.587, 0.114)


@dataclass(frozen=True)
class Upsampling(Serializable):
    mode: UpsampleMode = DEFAULT_UPSAMPLE
    strength: float = 1.0  # how much of the content's fine detail; 0 is bicubic
    radius: int = 2  # window radius at the model's resolution
    eps: float = 1e-3  # ridge on a_c, in squared [0, 1] intensity units: larger = less detail in low contrast
    # output pixels computed at once: a memory bound that leaves the result as it is
    strip_pixels: int = 1 << 17

    def __post_init__(self) -> None:
        if self.mode not in UPSAMPLE_MODES:
            raise ValueError(f"upsample must be one of {UPSAMPLE_MODES}, not {self.mode!r}")
        if not (math.isfinite(self.strength) and 0.0 <= self.strength <= 2.0):
            raise ValueError(f"upsample strength must lie in [0, 2], got {self.strength}")
        if self.radius < 1:
            raise ValueError(f"upsample radius must be >= 1, got {self.radius}")
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise ValueError(f"upsample eps must be > 0, got {self.eps}")
        if self.strip_pixels < 1:
            raise ValueError(f"strip_pixels must be >= 1, got {self.strip_pixels}")

    @property
    def guided(self) -> bool:
        return self.mode == "guided" and self.strength > 0


def luminance(img_B3HW: torch.Tensor) -> torch.Tensor:
    """(B, 1, H, W) luma (Rec. 601) of RGB images."""
    w = img_B3HW.new_tensor(_LUMA).view(1, 3, 1, 1)
    return (img_B3HW * w).sum(1, keepdim=True)


def _box(x_BCHW: torch.Tensor, radius: int) -> torch.Tensor:
    """Mean over (2r+1) x (2r+1) windows, edges replicated."""
    k = 2 * radius + 1
    return F.avg_pool2d(F.pad(x_BCHW, (radius,) * 4, mode="replicate"), k, stride=1)


def detail_slopes(drawing_B3hw: torch.Tensor, guide_B1hw: torch.Tensor, radius: int, eps: float) -> torch.Tensor:
    """a_c of the module doc, (B, 3, h, w): each drawing channel's local slope on the guide's luminance."""
    r = radius
    mean_i, mean_p = _box(guide_B1hw, r), _box(drawing_B3hw, r)
    cov = _box(guide_B1hw * drawing_B3hw, r) - mean_i * mean_p
    var = _box(guide_B1hw * guide_B1hw, r) - mean_i * mean_i
    return _box(cov / (var.clamp_min(0) + eps), r)


def _axis_weights(n_out: int, n_in: int, start: int, stop: int, device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bilinear taps of output positions [start, stop) (`align_corners=False`): (lower, upper, upper weight)."""
    pos = (torch.arange(start, stop, device=device, dtype=torch.float64) + 0.5) * (n_in / n_out) - 0.5
    pos = pos.clamp(0, n_in - 1)
    lo = pos.floor().long()
    hi = (lo + 1).clamp(max=n_in - 1)
    return lo, hi, (pos - lo).float()


def _widened(x_Chw: torch.Tensor, W: int) -> torch.Tensor:
    """`x` resized bilinearly along its width to `W`, channels last: (h, W, C), once per image."""
    lo, hi, w = _axis_weights(W, x_Chw.shape[2], 0, W, x_Chw.device)
    taps_Ww = x_Chw.new_zeros(W, x_Chw.shape[2])
    cols = torch.arange(W, device=x_Chw.device)
    taps_Ww.index_put_((cols, lo), 1 - w, accumulate=True)
    taps_Ww.index_put_((cols, hi), w, accumulate=True)
    return torch.matmul(taps_Ww, x_Chw.permute(1, 2, 0))  # (h, W, w) @ (h, w, C)


def _rows_of(x_hWC: torch.Tensor, H: int, rows: tuple[int, int]) -> torch.Tensor:
    """Rows [rows) of the width-resized `x` resized bilinearly to `H` rows: (rows, W, C), exactly those of the whole."""
    lo, hi, w = _axis_weights(H, x_hWC.shape[0], *rows, x_hWC.device)
    return torch.lerp(x_hWC.index_select(0, lo), x_hWC.index_select(0, hi), w[:, None, None])


def guide_image(content: Image.Image, fit: Fit, size: tuple[int, int]) -> Image.Image:
    """The content on the result's frame at `size` (w, h): the centre square for `crop`, else all of it."""
    content = content.convert("RGB") if content.mode != "RGB" else content
    if fit.mode == "crop":
        return content if content.size == size else ImageOps.fit(content, size, Image.BICUBIC)
    return content if content.size == size else content.resize(size, Image.BICUBIC)


def _crop_box(x_CSS: torch.Tensor, fit: Fit) -> torch.Tensor:
    left, top, right, bottom = fit.box
    return x_CSS[:, top:bottom, left:right]


@torch.no_grad()
def upscale(drawing_3SS: torch.Tensor, seen_3SS: torch.Tensor, fit: Fit, content: Image.Image,
            max_side: int | None, cfg: Upsampling) -> Image.Image:
    """The drawing (in [0, 1], the model's square) upsampled as `cfg` says to the size `unfit` gives. `seen_3SS`:
    the content as the model saw it; `content`: the content image at its own size."""
    W, H = result_size(fit, max_side)
    low_h, low_w = fit.box[3] - fit.box[1], fit.box[2] - fit.box[0]
    if not cfg.guided or (W <= low_w and H <= low_h):
        return unfit(tensor_to_pil(drawing_3SS), fit, max_side)
    # the 8-bit picture the model drew (what `unfit` resizes): float rounding stays out of the result
    levels_3hw = to_levels(_crop_box(drawing_3SS, fit))
    seen_y = luminance(_crop_box(seen_3SS.float().to(levels_3hw.device), fit).unsqueeze(0))
    slopes = detail_slopes(levels_3hw.unsqueeze(0) / 255.0, seen_y, cfg.radius, cfg.eps)[0]  # (3, h, w)
    guide = guide_image(content, fit, (W, H))
    # in 0..255 units: the slopes' three channels, -Y_low, the drawing's three; widened once at the model's rows
    low_hW7 = _widened(torch.cat([cfg.strength * slopes, -255.0 * seen_y[0], levels_3hw]), W)
    strips = _strips(low_hW7, guide, H, max(1, cfg.strip_pixels // W))
    return _pasted(strips, (W, H)) if low_hW7.device.type == "cpu" else _gathered(strips, (W, H), low_hW7.device)


def _strips(low_hW7: torch.Tensor, guide: Image.Image, H: int, step: int) -> Iterator[tuple[int, torch.Tensor]]:
    """(top row, the result's rows from there as uint8 (rows, W, 3)), `step` rows at a time."""
    W, device = low_hW7.shape[1], low_hW7.device
    for top in range(0, H, step):
        rows = (top, min(H, top + step))
        low_rW7 = _rows_of(low_hW7, H, rows)
        detail_rW1 = _luma(guide.crop((0, rows[0], W, rows[1])), device).add_(low_rW7[..., 3]).unsqueeze_(-1)
        new_rW3 = torch.addcmul(low_rW7[..., 4:], low_rW7[..., :3], detail_rW1)
        yield top, new_rW3.clamp_(0, 255).round_().to(torch.uint8)


def _pasted(strips: Iterator[tuple[int, torch.Tensor]], size: tuple[int, int]) -> Image.Image:
    """Host strips, each pasted into the result as it comes: beyond the result, one strip at a time."""
    out = Image.new("RGB", size)
    for top, strip_rW3 in strips:
        out.paste(Image.fromarray(strip_rW3.numpy(), "RGB"), (0, top))
    return out


def _gathered(strips: Iterator[tuple[int, torch.Tensor]], size: tuple[int, int], device: torch.device) -> Image.Image:
    """Device strips written into one uint8 result on the device, brought to the host once."""
    W, H = size
    out_HW3 = torch.empty((H, W, 3), dtype=torch.uint8, device=device)
    for top, strip_rW3 in strips:
        out_HW3[top:top + strip_rW3.shape[0]] = strip_rW3
    return Image.fromarray(out_HW3.cpu().numpy(), "RGB")


def _luma(img: Image.Image, device: torch.device) -> torch.Tensor:
    """An RGB image's luma (Rec. 601, `_LUMA`) as (H, W) float in 0..255 on `device`, unrounded."""
    luma_HW = torch.from_numpy(np.array(img.convert("F")))
    if device.type == "cuda":  # from page-locked memory, without waiting: a pageable copy would sync the host
        return luma_HW.pin_memory().to(device, non_blocking=True)
    return luma_HW.to(device)
