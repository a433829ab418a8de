"""Coherent sampling of video frames: the same content draws the same tokens from frame to frame.

`FrameSampler` follows the global motion between frames (phase correlation of their luminance); ``anchor`` keys
the draws to a grid that moves with the content, ``align`` draws on a canvas moved by whole tokens,
``reuse_scales`` keeps coarse tokens where the content hardly changed, ``settle`` averages with the previous
drawing there, ``blend`` mixes log-probabilities along the clip; a frame past ``cut_threshold`` is drawn afresh.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from stylevar.models.sampling import keyed_sample, position_keys
from stylevar.processing.upsample import luminance
from stylevar.processing.video import DEFAULT_TEMPORAL, TEMPORAL_MODES, TemporalMode

__all__ = ["DEFAULT_TEMPORAL", "TEMPORAL_MODES", "TemporalMode", "Coherence", "FrameSampler", "coherence_of",
           "estimate_shift", "shift_grid"]
NO_SOURCE = 1e3  # the change where a position has no counterpart in the previous frame


@dataclass(frozen=True)
class Coherence:
    """How consecutive frames share their draws (module doc)."""

    anchor: bool = True  # the noise grid follows the global motion
    # draw on a canvas that moves with the content in whole tokens of scale `align_scale` (-1: the finest)
    align: bool = False
    align_scale: int = -1
    blend: float = 0.0  # weight of the previous frame's moved log-probabilities, in [0, 1)
    reuse_scales: int = 0  # the first k scales' tokens reused where the content changed little (-j: all but j)
    reuse_threshold: float = 0.03
    # out_t = (1 - settle) drawing_t + settle out_{t-1} (moved by the canvas's step), where the previous frame covers it
    settle: float = 0.0
    cut_threshold: float = 0.15

    def __post_init__(self) -> None:
        for name in ("blend", "settle"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 <= value < 1.0):
                raise ValueError(f"{name} must lie in [0, 1), got {value}")
        if not (self.reuse_threshold >= 0 and self.cut_threshold > 0):
            raise ValueError("reuse_threshold must be >= 0 and cut_threshold > 0")


def coherence_of(mode: TemporalMode | Coherence) -> Coherence | None:
    """The sampler of a temporal mode; None for the per-frame seeds (independent, same-seed)."""
    if isinstance(mode, Coherence):
        return mode
    if mode not in TEMPORAL_MODES:
        raise ValueError(f"temporal mode must be one of {', '.join(TEMPORAL_MODES)}, not {mode!r}")
    if mode == "coherent":
        return Coherence(anchor=True, align=True, align_scale=-2, settle=0.5)
    if mode == "coherent-reuse":  # every scale but the finest: the canvas moves in whole tokens of all but the coarse
        return Coherence(anchor=True, align=True, align_scale=-2, settle=0.5, reuse_scales=-1)
    return None


def estimate_shift(a_HW: torch.Tensor, b_HW: torch.Tensor) -> torch.Tensor:
    """The global translation d (dx, dy) in pixels with b(p) ~ a(p - d), by phase correlation (subpixel)."""
    H, W = a_HW.shape
    win = torch.hann_window(H, periodic=False, device=a_HW.device)[:, None] * \
        torch.hann_window(W, periodic=False, device=a_HW.device)[None, :]
    fa = torch.fft.rfft2((a_HW - a_HW.mean()) * win)
    fb = torch.fft.rfft2((b_HW - b_HW.mean()) * win)
    cross = fb * fa.conj()
    r_HW = torch.fft.irfft2(cross / cross.abs().clamp_min(1e-9), s=(H, W))
    peak = int(r_HW.argmax())
    py, px = divmod(peak, W)
    d = []
    for pos, n, line in ((px, W, r_HW[py]), (py, H, r_HW[:, px])):
        left, mid, right = float(line[(pos - 1) % n]), float(line[pos]), float(line[(pos + 1) % n])
        den = left - 2 * mid + right
        frac = 0.5 * (left - right) / den if den < 0 else 0.0
        shift = pos + max(-0.5, min(0.5, frac))
        d.append(shift - n if shift > n / 2 else shift)
    return torch.tensor(d, dtype=torch.float32)


def shift_grid(x_BCHW: torch.Tensor, d_B2: torch.Tensor, mode: str = "bilinear") -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` moved by d (dx, dy) pixels, out(p) = x(p - d), and the mask of where that source lies inside ``x``."""
    B, _, H, W = x_BCHW.shape
    d = d_B2.to(x_BCHW.device, torch.float32)
    ys = torch.arange(H, device=x_BCHW.device, dtype=torch.float32)
    xs = torch.arange(W, device=x_BCHW.device, dtype=torch.float32)
    src_x = xs[None, None, :] - d[:, 0, None, None]  # (B, 1, W)
    src_y = ys[None, :, None] - d[:, 1, None, None]  # (B, H, 1)
    grid = torch.stack([((2 * src_x + 1) / W - 1).expand(B, H, W), ((2 * src_y + 1) / H - 1).expand(B, H, W)], -1)
    out = F.grid_sample(x_BCHW.float(), grid, mode=mode, padding_mode="border", align_corners=False)
    inside = (src_x > -0.5) & (src_x < W - 0.5) & (src_y > -0.5) & (src_y < H - 0.5)
    return out, inside.unsqueeze(1)


@dataclass(frozen=True)
class FrameMotion:
    """What `FrameSampler.begin` measured for a batch of frames (model pixels, (dx, dy))."""

    raw_B2: torch.Tensor  # the content's accumulated shift since the clip's first frame
    offset_B2: torch.Tensor  # where the model sees it: `raw`, or (align) rounded to whole tokens
    prev_offset_B2: torch.Tensor  # the previous frame's `offset` (its own after a cut: nothing moves)
    change_BHW: torch.Tensor  # |frame - moved previous frame|, channel mean; NO_SOURCE where nothing maps
    cut_B: torch.Tensor  # bool: drawn afresh (the clip's first frame, or a cut)

    @property
    def phase_B2(self) -> torch.Tensor:
        """How far each frame is moved before the model sees it (and its drawing moved back after)."""
        return self.offset_B2 - self.raw_B2


class FrameSampler:
    """Draws the tokens of a clip's frames (a `TokenSampler`): pass it as the seed of `StyleVAR.generate`, calling
    `begin(frames)` before each call, the call's rows the clip's next frames in order."""

    def __init__(self, seed: int, cfg: Coherence, patch_nums: Sequence[int], side: int):
        self.seed, self.cfg, self.side = int(seed), cfg, side
        self.patch_nums = tuple(patch_nums)
        self._scale = {pn * pn: k for k, pn in enumerate(self.patch_nums)}
        self._prev_gray: torch.Tensor | None = None  # (H, W) the last frame's guide luminance
        self._prev_colour: torch.Tensor | None = None  # (3, S, S)
        self._raw = torch.zeros(2)  # the last frame's accumulated shift and where the model saw it
        self._offset = torch.zeros(2)
        k = cfg.align_scale % len(self.patch_nums)
        self.quantum = side / self.patch_nums[k] if cfg.align else 0.0  # the canvas moves in steps of this
        K = len(self.patch_nums)
        self.reused = max(0, cfg.reuse_scales if cfg.reuse_scales >= 0 else K + cfg.reuse_scales)  # scales < this
        self._prev_lp: list[torch.Tensor | None] = [None] * len(self.patch_nums)  # (pn, pn, V) per scale
        self._prev_tokens: list[torch.Tensor | None] = [None] * len(self.patch_nums)  # (pn, pn)
        self.motion: FrameMotion | None = None
        self._prev_drawing: torch.Tensor | None = None  # (3, S, S) the last frame's settled drawing (canvas)

    def begin(self, frames_B3SS: torch.Tensor, guides_BHW: torch.Tensor | None = None,
              scale: tuple[float, float] = (1.0, 1.0)) -> FrameMotion:
        """Measure the batch's motion before its `generate` call. ``frames``: as the model sees them, in [0, 1];
        ``guides``: the luminance to estimate it on (default: the frames'), ``scale``: model pixels per guide pixel."""
        frames = frames_B3SS.detach().float()
        guides = luminance(frames)[:, 0] if guides_BHW is None else guides_BHW.detach().float()
        per_px = torch.tensor(scale, dtype=torch.float32)
        motions, changes, cuts = [], [], []
        prev_g, prev_c = self._prev_gray, self._prev_colour
        for b in range(frames.shape[0]):
            if prev_g is None or prev_g.shape != guides[b].shape:
                d, change, cut = torch.zeros(2), torch.full(frames.shape[2:], NO_SOURCE, device=frames.device), True
            else:
                d = estimate_shift(prev_g, guides[b]) * per_px
                moved, inside = shift_grid(prev_c[None], d[None])
                change = (frames[b] - moved[0]).abs().mean(0).masked_fill(~inside[0, 0], NO_SOURCE)
                cut = bool(change[inside[0, 0]].mean() > self.cfg.cut_threshold) if inside.any() else True
                if cut:
                    d, change = torch.zeros(2), torch.full_like(change, NO_SOURCE)
            motions.append(d)
            changes.append(change)
            cuts.append(cut)
            prev_g, prev_c = guides[b], frames[b]
        raw = self._raw + torch.stack(motions).cumsum(0)
        offset = raw if not self.quantum else torch.round(raw / self.quantum) * self.quantum
        prev = torch.cat([self._offset[None], offset[:-1]])
        cut_B = torch.tensor(cuts)
        prev[cut_B] = offset[cut_B]
        self._prev_gray, self._prev_colour, self._raw, self._offset = prev_g, prev_c, raw[-1], offset[-1]
        self.motion = FrameMotion(raw, offset, prev, torch.stack(changes), cut_B)
        return self.motion

    def settle(self, drawings_B3SS: torch.Tensor) -> torch.Tensor:
        """The batch's drawings (on the canvas, in [0, 1]) averaged with the previous frames' (``settle``)."""
        if self.cfg.settle == 0:
            return drawings_B3SS
        assert self.motion is not None
        out, prev = [], self._prev_drawing
        for b in range(drawings_B3SS.shape[0]):
            own = drawings_B3SS[b].float()
            if prev is not None and not bool(self.motion.cut_B[b]) and prev.shape == own.shape:
                step = (self.motion.offset_B2[b] - self.motion.prev_offset_B2[b])[None]
                moved, inside = shift_grid(prev[None], step)
                w = self.cfg.settle * (inside[0] & self._still(b)).float()
                own = (1 - w) * own + w * moved[0]
            out.append(own)
            prev = own
        self._prev_drawing = prev
        return torch.stack(out).to(drawings_B3SS.dtype)

    def _still(self, b: int) -> torch.Tensor:
        """(1, S, S) bool: where frame b's content changed less than ``reuse_threshold``, on the canvas."""
        assert self.motion is not None
        cell = max(1, round(self.side / self.patch_nums[-1]))
        change = F.avg_pool2d(self.motion.change_BHW[b][None, None], cell, ceil_mode=True)
        change = F.interpolate(change, size=(self.side, self.side), mode="nearest")
        on_canvas, _ = shift_grid(change, self.motion.phase_B2[b:b + 1], mode="nearest")
        return on_canvas[0] < self.cfg.reuse_threshold

    def keys(self, k: int) -> torch.Tensor:
        """(B, pn * pn) position keys of scale k: the token grid moved by the accumulated motion (anchor)."""
        pn = self.patch_nums[k]
        assert self.motion is not None
        device = self.motion.change_BHW.device
        grid = torch.arange(pn, device=device)
        if self.cfg.anchor:
            shift = torch.round(self.motion.offset_B2 * pn / self.side).long().to(device)  # (B, 2) tokens
        else:
            shift = torch.zeros(self.motion.offset_B2.shape[0], 2, dtype=torch.long, device=device)
        x = grid[None, None, :] - shift[:, 0, None, None]
        y = grid[None, :, None] - shift[:, 1, None, None]
        return position_keys(self.seed, k, x.expand(-1, pn, pn), y.expand(-1, pn, pn)).flatten(1)

    def __call__(self, logits_BlV: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
        if self.motion is None or self.motion.cut_B.shape[0] != logits_BlV.shape[0]:
            raise RuntimeError("FrameSampler: call begin(frames) with this call's frames before generate")
        B, l, V = logits_BlV.shape
        k = self._scale[l]
        keys_Bl = self.keys(k)
        cfg = self.cfg
        if cfg.blend == 0 and k >= self.reused:  # nothing carried over at this scale: one call
            tokens = keyed_sample(logits_BlV, keys_Bl, top_k, top_p)
            self._prev_tokens[k] = tokens[-1].view(self.patch_nums[k], -1)
            return tokens
        return torch.stack([self._row(logits_BlV[b], keys_Bl[b], b, k, top_k, top_p) for b in range(B)])

    def _row(self, logits_lV: torch.Tensor, keys_l: torch.Tensor, b: int, k: int, top_k: int, top_p: float
             ) -> torch.Tensor:
        """Frame b's tokens at scale k, from the previous frame's (this call's row b - 1, or the last call's)."""
        pn, cfg, motion = self.patch_nums[k], self.cfg, self.motion
        fresh = bool(motion.cut_B[b]) or self._prev_tokens[k] is None
        d_12 = (motion.offset_B2[b:b + 1] - motion.prev_offset_B2[b:b + 1]) * pn / self.side  # tokens of this scale
        step_12 = (torch.round(motion.offset_B2[b:b + 1] * pn / self.side)
                   - torch.round(motion.prev_offset_B2[b:b + 1] * pn / self.side))  # the key grid's step
        lp_lV = logits_lV.float().log_softmax(-1) if cfg.blend > 0 else logits_lV
        if cfg.blend > 0 and not fresh and self._prev_lp[k] is not None:
            prev = self._prev_lp[k].permute(2, 0, 1)[None]  # (1, V, pn, pn)
            moved, inside = shift_grid(prev, d_12)
            moved_lV = moved[0].flatten(1).T
            w_l1 = cfg.blend * inside[0, 0].flatten().float()[:, None]
            lp_lV = (1 - w_l1) * lp_lV + w_l1 * moved_lV
        tokens_l = keyed_sample(lp_lV[None], keys_l[None], top_k, top_p)[0]
        if k < self.reused and not fresh:
            prev_tok = self._prev_tokens[k].to(torch.float32)[None, None]
            moved, inside = shift_grid(prev_tok, step_12, mode="nearest")
            change = F.adaptive_avg_pool2d(motion.change_BHW[b][None, None], pn)[0, 0]
            reuse = (inside[0, 0] & (change < cfg.reuse_threshold)).flatten()
            tokens_l = torch.where(reuse, moved.flatten().round().long(), tokens_l)
        if cfg.blend > 0:
            self._prev_lp[k] = lp_lV.view(pn, pn, -1)
        self._prev_tokens[k] = tokens_l.view(pn, pn)
        return tokens_l
