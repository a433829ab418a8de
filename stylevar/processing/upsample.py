"""From the model's resolution to the size the user gets back (the content's size, or `max_side`).

``mode="bicubic"``: the drawing resized. ``mode="guided"``: the drawing resized plus the content's fine detail,
weighted by a guided filter fitted at the model's resolution (He, Sun and Tang):
out_c = up(p)_c + strength * up(a_c) * (Y_full - up(Y_low)). Computed in strips, so memory stays bounded.
"""
from __future__ import annotations

import bisect
import itertools
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
_CACHED_FLOATS = 1 << 18  # floats of the widened rows a strip lerps at once: in a core's cache, at most 1 MiB


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
    """Mean over (2r+1) x (2r+1) windows, edges replicated: `avg_pool2d`'s sums, term by term in its order (so its
    very values), a whole plane per term instead of a window per pixel."""
    k, (H, W) = 2 * radius + 1, x_BCHW.shape[-2:]
    padded = F.pad(x_BCHW, (radius,) * 4, mode="replicate")
    total = torch.zeros_like(x_BCHW)
    for dy in range(k):
        for dx in range(k):
            total += padded[..., dy:dy + H, dx:dx + W]
    return total.div_(k * k)


def detail_slopes(drawing_B3hw: torch.Tensor, guide_B1hw: torch.Tensor, radius: int, eps: float) -> torch.Tensor:
    """a_c of the module doc, (B, 3, h, w): each drawing channel's local slope on the guide's luminance."""
    i, p = guide_B1hw, drawing_B3hw
    mean_i, mean_p, mean_ip, mean_ii = _box(torch.cat([i, p, i * p, i * i], 1), radius).split([1, 3, 3, 1], 1)
    cov = mean_ip - mean_i * mean_p
    var = mean_ii - mean_i * mean_i
    return _box(cov / (var.clamp_min(0) + eps), radius)


def _axis_weights(n_out: int, n_in: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bilinear taps of the `n_out` output positions (`align_corners=False`): (lower, upper, upper weight)."""
    pos = (torch.arange(n_out, device=device, dtype=torch.float64) + 0.5) * (n_in / n_out) - 0.5
    pos = pos.clamp(0, n_in - 1)
    lo = pos.floor().long()
    hi = (lo + 1).clamp(max=n_in - 1)
    return lo, hi, (pos - lo).float()


def _widened(x_Chw: torch.Tensor, W: int) -> torch.Tensor:
    """`x` resized bilinearly along its width to `W`, each row's channels side by side: (h, C, W), once per image."""
    lo, hi, w = _axis_weights(W, x_Chw.shape[2], x_Chw.device)
    taps_Ww = x_Chw.new_zeros(W, x_Chw.shape[2])
    cols = torch.arange(W, device=x_Chw.device)
    taps_Ww.index_put_((cols, lo), 1 - w, accumulate=True)
    taps_Ww.index_put_((cols, hi), w, accumulate=True)
    C, h, w_in = x_Chw.shape
    return torch.matmul(x_Chw.transpose(0, 1).reshape(h * C, w_in), taps_Ww.T).view(h, C, W)  # one GEMM


@dataclass(frozen=True)
class _Rows:
    """The bilinear taps of the result's rows on the model's rows, by runs of rows that share both taps."""
    starts: list[int]  # each run's first row
    runs: list[tuple[int, int, int, int]]  # each run's rows [start, stop) and its (lower, upper) model row
    w_H11: torch.Tensor  # each row's upper weight, on the device

    @classmethod
    def of(cls, H: int, h: int, device: torch.device) -> _Rows:
        lo, hi, w = _axis_weights(H, h, torch.device("cpu"))  # on the host: the runs are read without a sync
        lo_H, hi_H = lo.numpy(), hi.numpy()
        cuts = [0, *(np.flatnonzero((np.diff(lo_H) != 0) | (np.diff(hi_H) != 0)) + 1).tolist(), H]
        runs = [(a, b, int(lo_H[a]), int(hi_H[a])) for a, b in itertools.pairwise(cuts)]
        return cls(cuts[:-1], runs, _to_device(w, device).view(H, 1, 1))


def _rows_into(out_r7W: torch.Tensor, low_h7W: torch.Tensor, rows: _Rows, top: int) -> None:
    """Rows [top, top + r) of the width-resized `low` resized bilinearly to `H` rows, written into `out`: each run
    one `lerp` of its two model rows, so exactly the values of the whole image."""
    bottom = top + len(out_r7W)
    for start, stop, lo, hi in rows.runs[bisect.bisect_right(rows.starts, top) - 1:]:
        if start >= bottom:
            return
        start, stop = max(start, top), min(stop, bottom)
        torch.lerp(low_h7W[lo], low_h7W[hi], rows.w_H11[start:stop], out=out_r7W[start - top:stop - top])


def guide_image(content: Image.Image, fit: Fit, size: tuple[int, int]) -> Image.Image:
    """The content on the result's frame at `size` (w, h): the centre square for `crop`, else all of it."""
    content = content.convert("RGB") if content.mode != "RGB" else content
    if content.size == size:
        return content
    return ImageOps.fit(content, size, Image.BICUBIC) if fit.mode == "crop" else content.resize(size, Image.BICUBIC)


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
    low_h7W = _widened(torch.cat([cfg.strength * slopes, -255.0 * seen_y[0], levels_3hw]), W)
    step = min(max(1, cfg.strip_pixels // W), max(1, _CACHED_FLOATS // (7 * W)))
    strips = _strips(low_h7W, guide, H, step)
    return _pasted(strips, (W, H)) if low_h7W.device.type == "cpu" else _gathered(strips, (W, H), low_h7W.device)


def _strips(low_h7W: torch.Tensor, guide: Image.Image, H: int, step: int) -> Iterator[tuple[int, torch.Tensor]]:
    """(top row, the result's rows from there as whole levels (rows, 3, W), float), `step` rows at a time. Each
    strip lives in a buffer the next one reuses: use it before asking for the next."""
    h, C, W = low_h7W.shape
    rows = _Rows.of(H, h, low_h7W.device)
    buf_S7W = low_h7W.new_empty(step, C, W)
    for top in range(0, H, step):
        low_r7W = buf_S7W[:min(H, top + step) - top]
        _rows_into(low_r7W, low_h7W, rows, top)
        detail_r1W = low_r7W[:, 3:4]
        detail_r1W[:, 0].add_(_luma(guide.crop((0, top, W, top + len(low_r7W))), low_h7W.device))
        yield top, low_r7W[:, 4:].addcmul_(low_r7W[:, :3], detail_r1W).clamp_(0, 255).round_()


def _pasted(strips: Iterator[tuple[int, torch.Tensor]], size: tuple[int, int]) -> Image.Image:
    """Host strips, each pasted into the result as it comes: beyond the result, one strip at a time."""
    out = Image.new("RGB", size, None)  # every pixel is pasted over
    for top, strip_r3W in strips:
        bands = [Image.fromarray(band_rW) for band_rW in np.array(strip_r3W.numpy().transpose(1, 0, 2), np.uint8)]
        out.paste(Image.merge("RGB", bands), (0, top))
    return out


def _gathered(strips: Iterator[tuple[int, torch.Tensor]], size: tuple[int, int], device: torch.device) -> Image.Image:
    """Device strips written into one uint8 result on the device, brought to the host once."""
    W, H = size
    out_HW3 = torch.empty((H, W, 3), dtype=torch.uint8, device=device)
    for top, strip_r3W in strips:
        out_HW3[top:top + len(strip_r3W)] = strip_r3W.transpose(1, 2)
    return Image.fromarray(out_HW3.cpu().numpy(), "RGB")


def _to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`; to a GPU from page-locked memory, without waiting (a pageable copy would sync)."""
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def _luma(img: Image.Image, device: torch.device) -> torch.Tensor:
    """An RGB image's luma (Rec. 601, `_LUMA`) as (H, W) float in 0..255 on `device`, unrounded."""
    return _to_device(torch.from_numpy(np.array(img.convert("F"))), device)
