"""Fast sampling (opt-in, `GenerationConfig.fast`): training-free token merging at the finest scales of the loop.

At the finest scales, 2 x 2 groups with little content detail go through the blocks as one merged token, copied
back to their four positions with a first-order residual correction (`FastSampling`). Off, nothing here runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from stylevar.models.transformer.attention import KVCache
from stylevar.models.transformer.block import Block, Guide, Modulation, token_rows
from stylevar.models.transformer.condition import Condition


@dataclass(frozen=True)
class FastSampling:
    """Every scale of at least ``min_tokens`` positions computes the ``keep`` fraction of its 2 x 2 groups (the
    most detailed) position by position and merges the others (0: every group merged; 1: the scale in full)."""

    keep: float = 0.25
    min_tokens: int = 25

    def __post_init__(self) -> None:
        if not 0.0 <= self.keep <= 1.0:
            raise ValueError(f"fast sampling: the keep fraction must lie in [0, 1], got {self.keep}")

    def detail_groups(self, patch_nums: Sequence[int]) -> list[int | None]:
        """Per scale: how many of its groups are computed position by position; None: the scale in full."""
        out: list[int | None] = []
        for pn in patch_nums:
            groups = (pn // 2) ** 2
            d = round(self.keep * groups) if pn * pn >= self.min_tokens else None
            out.append(None if d is None or d >= groups else d)
        return out

    def tokens(self, patch_nums: Sequence[int]) -> list[int]:
        """Per scale: the tokens its blocks compute (pn^2 in full; merged groups count once)."""
        return [pn * pn if d is None else pn * pn - 3 * ((pn // 2) ** 2 - d)
                for pn, d in zip(patch_nums, self.detail_groups(patch_nums))]


def take(t: torch.Tensor, idx_Rm: torch.Tensor, dim: int) -> torch.Tensor:
    """The rows ``idx_Rm`` (R, m) of ``t`` along ``dim`` (1 or 2), per batch row."""
    shape = list(t.shape)
    shape[dim] = idx_Rm.shape[1]
    view = [idx_Rm.shape[0]] + [1] * (t.ndim - 1)
    view[dim] = idx_Rm.shape[1]
    return t.gather(dim, idx_Rm.view(view).expand(shape))


def group_means(t: torch.Tensor, dim: int, pn: int) -> torch.Tensor:
    """Means over the 2 x 2 groups of the pn x pn positions along ``dim``: that dim becomes (pn // 2)^2."""
    moved = t.movedim(dim, -1)
    g = pn // 2
    grid = moved.reshape(-1, pn, pn)[:, : 2 * g, : 2 * g].float()
    means = F.avg_pool2d(grid, 2).to(t.dtype).reshape(*moved.shape[:-1], g * g)
    return means.movedim(-1, dim)


def detail_scores(tokens_BlC: torch.Tensor, pn: int) -> torch.Tensor:
    """High-frequency energy of a pn x pn token grid, (B, pn * pn): |x - mean3x3(x)|^2 per position."""
    B, l, C = tokens_BlC.shape
    x = tokens_BlC.float().transpose(1, 2).reshape(B, C, pn, pn)
    low = F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
    return (x - low).square().sum(1).flatten(1)


class GroupSplit:
    """One pruned scale's split of its positions, per row: the merged groups (R, f) and the positions
    computed one by one (R, n): the detail groups' four and, with an odd side, the last row and column."""

    def __init__(self, scores_Bl: torch.Tensor, pn: int, detail: int, rows: int):
        B, g = scores_Bl.shape[0], pn // 2
        group_scores_BG = group_means(scores_Bl, 1, pn)
        order_BG = group_scores_BG.argsort(dim=1, descending=True)
        detail_Bd, self.merged_Bf = order_BG[:, :detail], order_BG[:, detail:].sort(1).values
        gi, gj = detail_Bd // g, detail_Bd % g  # each detail group's four positions
        quad = torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1]], device=scores_Bl.device)
        pos_Bd4 = (2 * gi.unsqueeze(2) + quad[:, 0]) * pn + 2 * gj.unsqueeze(2) + quad[:, 1]
        ii, jj = torch.meshgrid(torch.arange(pn), torch.arange(pn), indexing="ij")
        edge = ((ii >= 2 * g) | (jj >= 2 * g)).flatten().nonzero().squeeze(1).to(scores_Bl.device)
        self.single_Bn = torch.cat([pos_Bd4.flatten(1), edge.expand(B, -1)], 1).sort(1).values
        self.pn, self.repeat = pn, rows // B  # guidance: the unstyled rows take the styled rows' split

    def _rows(self, idx_Bm: torch.Tensor) -> torch.Tensor:
        return idx_Bm.repeat(self.repeat, 1) if self.repeat > 1 else idx_Bm

    def tokens(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        """``t``'s rows along ``dim`` as the computed tokens: merged groups' means, then the single positions."""
        merged = take(group_means(t, dim, self.pn), self._rows(self.merged_Bf), dim)
        return torch.cat([merged, take(t, self._rows(self.single_Bn), dim)], dim)

    def positions(self, x_RmC: torch.Tensor) -> torch.Tensor:
        """The computed tokens' hidden states (R, m, C) back on the scale's positions (R, pn^2, C)."""
        R, _, C = x_RmC.shape
        g, f = self.pn // 2, self.merged_Bf.shape[1]
        groups_RGC = x_RmC.new_zeros(R, g * g, C).scatter(1, self._rows(self.merged_Bf).unsqueeze(2).expand(-1, -1, C),
                                                         x_RmC[:, :f])
        up_RCnn = groups_RGC.transpose(1, 2).reshape(R, C, g, g).repeat_interleave(2, 2).repeat_interleave(2, 3)
        up_RCnn = F.pad(up_RCnn, (0, self.pn - 2 * g, 0, self.pn - 2 * g))
        out_RlC = up_RCnn.flatten(2).transpose(1, 2)
        return out_RlC.scatter(1, self._rows(self.single_Bn).unsqueeze(2).expand(-1, -1, C), x_RmC[:, f:])


class ScalePruner:
    """The merged scales of one sampling loop (see the module doc)."""

    def __init__(self, plan: FastSampling, patch_nums: Sequence[int], guided: bool):
        self.detail, self.patch_nums, self.guided = plan.detail_groups(patch_nums), tuple(patch_nums), guided

    def full_until(self) -> int:
        """The number of leading tokens the loop's precomputed queries cover (up to the last full scale)."""
        last = max((k for k, d in enumerate(self.detail) if d is None), default=-1)
        return sum(pn * pn for pn in self.patch_nums[:last + 1])

    def prunes(self, k: int) -> bool:
        return self.detail[k] is not None

    def scale(self, k: int, start: int, x_RlC: torch.Tensor, run: Condition, blocks: Sequence[Block],
              mods: Sequence[Modulation], caches: Sequence[KVCache], alpha_RSl1: torch.Tensor,
              per_token: bool) -> torch.Tensor:
        """Scale k's hidden states (R, l, C) after the blocks, its flat groups merged."""
        R, l, _ = x_RlC.shape
        end, pn, B = start + l, self.patch_nums[k], R // 2 if self.guided else R
        split = GroupSplit(detail_scores(run.content_ln_BLC[:B, start:end], pn), pn, self.detail[k], R)
        x_RmC = x_in_RmC = split.tokens(x_RlC, 1)
        style_RSmC = split.tokens(run.style_ln_BSLC[:, :, start:end], 2)
        content_RmC = split.tokens(run.content_ln_BLC[:, start:end], 1)
        alpha_RSm1 = split.tokens(alpha_RSl1, 2)
        for blk, mod, cache in zip(blocks, mods, caches):
            if per_token:
                mod = type(mod)(*(split.tokens(m, 1) for m in token_rows(mod, start, end)))
            guide = Guide(alpha_RSm1, q_BHXc=blk.queries(style_RSmC, content_RmC, mod))
            x_RmC = blk(x_RmC, mod, guide, None, cache)
        # a merged group's positions: its hidden state plus each one's own input less the group's mean input
        return split.positions(x_RmC) + (x_RlC - split.positions(x_in_RmC))
