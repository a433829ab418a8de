"""What the reference images contribute: `StyleBlend` (several styles, weights, masks) and `Condition`
(the streams and embeddings computed once per pair); the blend's shares are `stylevar.models.transformer.model`'s doc."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F


@dataclass
class StyleBlend:
    """Several style images per row, blended by weight, each optionally confined to a region.

    `styles`: S tensors (B, 3, H, W) in [-1, 1]. `weights_BS`: >= 0 with a positive sum per row, (B, S) or
    (S,) (None: equal). `masks_BSHW`: in [0, 1], 1 = the style applies (None: everywhere); any H, W
    (area-resized to each scale's token grid).
    """

    styles: Sequence[torch.Tensor]
    weights_BS: torch.Tensor | None = None
    masks_BSHW: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not self.styles:
            raise ValueError("a style blend needs at least one style")
        B, S = self.styles[0].shape[0], len(self.styles)
        if any(s.shape != self.styles[0].shape for s in self.styles):
            raise ValueError(f"the styles of a blend differ in shape: {[tuple(s.shape) for s in self.styles]}")
        if self.weights_BS is not None:
            w = torch.as_tensor(self.weights_BS, dtype=torch.float32, device=self.styles[0].device)
            w = w.expand(B, S) if w.shape == (S,) else w
            if w.shape != (B, S):
                raise ValueError(f"style weights: expected {S} per row, got shape {tuple(w.shape)}")
            if not torch.isfinite(w).all() or (w < 0).any() or (w.sum(1) <= 0).any():
                raise ValueError("style weights must be finite, >= 0, and not all 0")
            self.weights_BS = w
        if self.masks_BSHW is not None:
            m = self.masks_BSHW
            if m.ndim != 4 or m.shape[:2] != (B, S):
                raise ValueError(f"style masks: expected (B={B}, S={S}, H, W), got {tuple(m.shape)}")
            if not torch.isfinite(m).all() or m.min() < 0 or m.max() > 1:
                raise ValueError("style masks must lie in [0, 1]")

    def normalised_weights(self) -> torch.Tensor:
        """(B, S), each row summing to 1 (equal weights when none were given)."""
        B, S = self.styles[0].shape[0], len(self.styles)
        w = self.weights_BS if self.weights_BS is not None else torch.ones(B, S, device=self.styles[0].device)
        return w / w.sum(1, keepdim=True)

    def shares(self, patch_nums: Sequence[int]) -> torch.Tensor:
        """Each style's part of the blend at every token, (B, S, L): coverage(t) * share_s(t) (module doc)."""
        return self._shares_at(patch_nums)

    def pixel_shares(self, size: int) -> torch.Tensor:
        """The same at every pixel of a `size` x `size` image, (B, S, size, size)."""
        return self._shares_at((size,)).unflatten(2, (size, size))

    def _shares_at(self, sides: Sequence[int]) -> torch.Tensor:
        """Shares on square grids of the given sides, flattened and concatenated: (B, S, sum of side^2)."""
        w_BS = self.normalised_weights()
        B, S = w_BS.shape
        L = sum(n * n for n in sides)
        if self.masks_BSHW is None:
            m_BSL = torch.ones(B, S, L, device=w_BS.device)
        else:
            m = self.masks_BSHW.float().to(w_BS.device)
            m_BSL = torch.cat([F.interpolate(m, size=(n, n), mode="area").flatten(2) for n in sides], 2)
        wm_BSL = w_BS.unsqueeze(2) * m_BSL
        total_B1L = wm_BSL.sum(1, keepdim=True)
        share_BSL = torch.where(total_B1L > 0, wm_BSL / total_B1L.clamp_min(1e-12), torch.zeros_like(wm_BSL))
        coverage_B1L = (m_BSL * (w_BS > 0).unsqueeze(2)).sum(1, keepdim=True).clamp_max(1.0)
        return coverage_B1L * share_BSL


@dataclass
class Condition:
    """What the reference images contribute, computed once per (content, style) pair or style blend."""

    cond_BD: torch.Tensor  # style embedding (the weight-blend of several): AdaLN input
    sos_B1C: torch.Tensor  # content embedding + pos_start: the first target token (before lvl/pos)
    style_ln_BSLC: torch.Tensor  # LayerNorm'ed token streams of the S styles
    content_ln_BLC: torch.Tensor  # LayerNorm'ed content token stream
    inject_BLC: torch.Tensor | None = None  # content_in(content stream), added to the target inputs (variant)
    # each style's part of the blend at each token (StyleBlend.shares), times alpha_k; None: one style, everywhere
    shares_BSL: torch.Tensor | None = None
    # the content image through the style encoder: AdaLN input of the pass without the style (guidance)
    unstyled_BD: torch.Tensor | None = None
    # AdaLN input per token (masked blends: the styles' embeddings by share, the unstyled one for the rest);
    # None: cond_BD at every token
    adaln_BLD: torch.Tensor | None = None

    def adaln(self) -> torch.Tensor:
        """The AdaLN input: (B, D), or (B, L, D) per token."""
        return self.cond_BD if self.adaln_BLD is None else self.adaln_BLD

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "Condition":
        fields = (getattr(self, f.name) for f in dataclasses.fields(self))  # not astuple: it deep-copies tensors
        return Condition(*(None if t is None else fn(t) for t in fields))

    @property
    def num_styles(self) -> int:
        return self.style_ln_BSLC.shape[1]

    def coverage_BL(self) -> torch.Tensor:
        """How styled each token is, in [0, 1] (1 everywhere for a single style without a mask)."""
        if self.shares_BSL is None:
            return self.content_ln_BLC.new_ones(self.content_ln_BLC.shape[:2])
        return self.shares_BSL.sum(1)

    def unstyled(self) -> "Condition":
        """The condition without the style: the content image as the style (every style stream is the
        content's, AdaLN from the content's style embedding); what `condition(content, content)` gives."""
        if self.unstyled_BD is None:
            raise ValueError("this condition was made without unstyled=True: it cannot give the unstyled pass")
        streams = self.content_ln_BLC.unsqueeze(1).expand_as(self.style_ln_BSLC)
        per_token = None if self.adaln_BLD is None else self.unstyled_BD.unsqueeze(1).expand_as(self.adaln_BLD)
        return Condition(self.unstyled_BD, self.sos_B1C, streams, self.content_ln_BLC, self.inject_BLC,
                         self.shares_BSL, self.unstyled_BD, per_token)

    def cat(self, other: "Condition") -> "Condition":
        """Rows of ``self`` then rows of ``other`` (the same fields set)."""
        pairs = [(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self)]
        if any((a is None) != (b is None) for a, b in pairs):
            raise ValueError("conditions with different fields cannot be batched together")
        return Condition(*(None if a is None else torch.cat([a, b]) for a, b in pairs))

    def rows(self, start: int, end: int) -> "Condition":
        return self._map(lambda t: t[start:end])

    def repeat_interleave(self, n: int) -> "Condition":
        """Each row n times (the G rollouts of a group share their pair's condition)."""
        return self._map(lambda t: t.repeat_interleave(n, 0))

    def target_inputs(self, x_BlC: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """Target inputs at positions [start, end), plus the content injection when the model has one."""
        return x_BlC if self.inject_BLC is None else x_BlC + self.inject_BLC[:, start:end]
