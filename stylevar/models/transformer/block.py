"""A StyleVAR block and the head: AdaLN-modulated blended attention and FFN, with stochastic depth on both residual
branches in training (`drop_path_factors`)."""
from __future__ import annotations

from typing import NamedTuple, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from stylevar.config import StyleVARConfig
from stylevar.models.transformer.attention import BlendedAttention, KVCache


class FFN(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh")  # CPU inference runs it inside fc1's call (`runtime.inference`)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Modulation(NamedTuple):
    """A block's AdaLN modulations, each (B, 1, C), or (B, L, C) per token: x + attn(LN(x) * (1 + scale1) +
    shift1) * gate1, then the same for the FFN with the 2s. Unpacks as (g1, g2, s1, s2, b1, b2)."""

    gate1: torch.Tensor
    gate2: torch.Tensor
    scale1: torch.Tensor
    scale2: torch.Tensor
    shift1: torch.Tensor
    shift2: torch.Tensor


class HeadModulation(NamedTuple):
    """The head's AdaLN modulations, each (B, 1, C), or (B, L, C) per token."""

    scale: torch.Tensor
    shift: torch.Tensor


ModulationT = TypeVar("ModulationT", Modulation, HeadModulation)


def token_rows(mod: ModulationT, start: int, end: int) -> ModulationT:
    """Per-token modulations (B, L, C) at positions [start, end)."""
    return type(mod)(*(m[:, start:end] for m in mod))


def _ada_lin(lin: nn.Module, cond_BD: torch.Tensor, n: int, dim: int) -> tuple[torch.Tensor, ...]:
    """The n modulations of an AdaLN input: (B, D) -> n x (B, 1, C), per token (B, L, D) -> n x (B, L, C)."""
    if cond_BD.ndim == 3:
        return lin(cond_BD).unflatten(-1, (n, dim)).unbind(2)
    return lin(cond_BD).view(-1, 1, n, dim).unbind(2)


def drop_path_factors(rows: int, p: float, like: torch.Tensor) -> torch.Tensor:
    """What each row of a residual branch is multiplied by in training, (rows, 1, 1) like ``like``: 0 with
    probability ``p`` (drawn from torch's global generator, so checkpointing recomputes the same), else 1 / (1 - p)."""
    if p == 0.0:
        return like.new_ones((rows, 1, 1))
    keep = 1.0 - p
    return like.new_empty((rows, 1, 1)).bernoulli_(keep).div_(keep)


class Guide(NamedTuple):
    """What a block's queries come from: the guide streams, or their queries computed beforehand."""

    alpha_BSl1: torch.Tensor  # blend coefficient of each style stream at each position
    style_ln_BSlC: torch.Tensor | None = None  # LayerNorm'ed tokens of the S styles
    content_ln_BlC: torch.Tensor | None = None  # LayerNorm'ed content tokens
    q_BHXc: torch.Tensor | None = None  # `Block.queries` of the streams, (B, H, (S + 1) * l, c)


class Block(nn.Module):
    """``drop_path``: this block's stochastic-depth probability in training (`StyleVARConfig.drop_path_rates`)."""

    def __init__(self, cfg: StyleVARConfig, drop_path: float = 0.0):
        super().__init__()
        C = cfg.embed_dim
        self.dim, self.eps = C, cfg.norm_eps
        self.drop_path = float(drop_path)
        self.attn = BlendedAttention(C, cfg.num_heads, cfg.attn_l2_norm, cfg.dropout)
        self.ffn = FFN(C, round(C * cfg.mlp_ratio))
        self.ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(C, 6 * C))

    def modulation(self, cond_BD: torch.Tensor) -> Modulation:
        """AdaLN modulations, each (B, 1, C), or (B, L, C) for a per-token condition (B, L, D)."""
        return Modulation(*_ada_lin(self.ada_lin, cond_BD, 6, self.dim))

    def queries(self, style_ln_BSlC: torch.Tensor, content_ln_BlC: torch.Tensor, mod: Modulation) -> torch.Tensor:
        """The guide streams' queries (B, H, (S + 1) * l, c), the styles' rows then the content's."""
        s1, b1 = mod.scale1, mod.shift1
        style_BSlC = style_ln_BSlC * (1 + s1.unsqueeze(1)) + b1.unsqueeze(1)
        content_BlC = content_ln_BlC * (1 + s1) + b1
        B, S, l, C = style_BSlC.shape
        return self.attn.queries(torch.cat([style_BSlC.reshape(B, S * l, C), content_BlC], dim=1))

    def forward(self, x_BLC: torch.Tensor, mod: Modulation, guide: Guide, mask: torch.Tensor | None = None,
                cache: KVCache | None = None) -> torch.Tensor:
        """``mod``: `modulation(cond)` here; ``mask``: teacher forcing's; ``cache``: generation's."""
        factors = None
        if self.training:  # checked first: in eval the rate is never read
            rows = x_BLC.shape[0]
            factors = (drop_path_factors(rows, self.drop_path, x_BLC), drop_path_factors(rows, self.drop_path, x_BLC))
        return self.step(x_BLC, mod, guide, mask, cache, factors)

    def step(self, x_BLC: torch.Tensor, mod: Modulation, guide: Guide, mask: torch.Tensor | None,
             cache: KVCache | None, factors: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """The block's computation; ``factors``: the drop-path factors (training), or None (eval)."""
        g1, g2, s1, s2, b1, b2 = mod
        h = F.layer_norm(x_BLC, (self.dim,), eps=self.eps) * (1 + s1) + b1
        q_BHXc = guide.q_BHXc
        if q_BHXc is None:
            q_BHXc = self.queries(guide.style_ln_BSlC, guide.content_ln_BlC, mod)
        attn_BLC = self.attn(h, q_BHXc, guide.alpha_BSl1, mask, cache) * g1
        x_BLC = x_BLC + (attn_BLC if factors is None else attn_BLC * factors[0])
        h = F.layer_norm(x_BLC, (self.dim,), eps=self.eps) * (1 + s2) + b2
        ffn_BLC = self.ffn(h) * g2
        return x_BLC + (ffn_BLC if factors is None else ffn_BLC * factors[1])

    def extra_repr(self) -> str:
        return f"drop_path={self.drop_path:g}" if self.drop_path else ""


class AdaLNHead(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))

    def modulation(self, cond_BD: torch.Tensor) -> HeadModulation:
        return HeadModulation(*_ada_lin(self.ada_lin, cond_BD, 2, self.dim))

    def forward(self, x_BLC: torch.Tensor, mod: HeadModulation) -> torch.Tensor:
        scale, shift = mod
        return F.layer_norm(x_BLC, (self.dim,), eps=self.eps) * (1 + scale) + shift
