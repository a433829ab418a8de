"""Blended cross-attention: the target's history gives keys and values; style and content tokens ask.

For scale k, out = alpha_k * attn(q_style) + (1 - alpha_k) * attn(q_content), projected once. With S styles,
out(t) = attn(q_content)(t) + sum_s beta_s(t) * (attn(q_style_s)(t) - attn(q_content)(t)), sum_s beta_s <= 1.
The guide queries do not depend on what is sampled: generation computes them before its loop (`Block.queries`).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def compute_dtype(device: torch.device, default: torch.dtype) -> torch.dtype:
    """The dtype autocast computes matrix products in on ``device`` now, else ``default`` (the KV cache's dtype)."""
    if torch.amp.is_autocast_available(device.type) and torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return default


class KVCache:
    """Preallocated keys/values of every target token, written once per scale, for one block."""

    def __init__(self, batch: int, heads: int, length: int, head_dim: int, device, dtype):
        self.k_BHLc = torch.empty(batch, heads, length, head_dim, device=device, dtype=dtype)
        self.v_BHLc = torch.empty_like(self.k_BHLc)
        self.end = 0

    def append(self, k_BHlc: torch.Tensor, v_BHlc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start, self.end = self.end, self.end + k_BHlc.shape[2]
        self.k_BHLc[:, :, start:self.end] = k_BHlc
        self.v_BHLc[:, :, start:self.end] = v_BHlc
        return self.k_BHLc[:, :, : self.end], self.v_BHLc[:, :, : self.end]


class BlendedAttention(nn.Module):
    def __init__(self, dim: int, heads: int, l2_norm: bool = True, dropout: float = 0.0):
        super().__init__()
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.l2_norm = l2_norm
        self.q_guide = nn.Linear(dim, dim, bias=True)  # queries of the style and content streams
        self.kv_target = nn.Linear(dim, 2 * dim, bias=False)  # keys and values of the target stream
        self.v_bias = nn.Parameter(torch.zeros(dim))  # keys have no bias
        self.proj = nn.Linear(dim, dim)
        self.dropout = dropout
        if l2_norm:
            self.scale_mul_1H11 = nn.Parameter(torch.full((1, heads, 1, 1), math.log(4.0)))
            self.scale = 1.0
        else:
            self.scale = 0.25 / math.sqrt(self.head_dim)

    def _split(self, x_BLC: torch.Tensor) -> torch.Tensor:
        B, L, _ = x_BLC.shape
        return x_BLC.view(B, L, self.heads, self.head_dim).transpose(1, 2)

    def keys_values(self, h_BLC: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, H, L, c) in the projection's dtype (the autocast dtype under autocast)."""
        kv = self.kv_target(h_BLC)
        k, v = kv.chunk(2, dim=-1)
        k, v = self._split(k), self._split((v + self.v_bias).to(kv.dtype))
        if self.l2_norm:
            k = F.normalize(k, dim=-1).to(kv.dtype)
        return k, v

    def queries(self, g_BXC: torch.Tensor) -> torch.Tensor:
        """Queries (B, H, X, c) of modulated guide tokens (B, X, C): the style streams', then the content's."""
        q_lin = self.q_guide(g_BXC)
        q = self._split(q_lin)
        if self.l2_norm:
            q = (F.normalize(q, dim=-1) * self.scale_mul_1H11.clamp_max(math.log(100.0)).exp()).to(q_lin.dtype)
        return q

    def forward(
        self,
        h_BLC: torch.Tensor,  # modulated target tokens (the new ones, in generation)
        q_BHXc: torch.Tensor,  # `queries` of the S style streams then the content stream: X = (S + 1) * l
        alpha_BSl1: torch.Tensor,  # blend coefficient of each style per query position
        mask_XlL: torch.Tensor | None = None,  # bool, (S + 1) * l rows, True = may attend (teacher forcing)
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        k, v = self.keys_values(h_BLC)
        if cache is not None:
            k, v = cache.append(k, v)
        B, S = q_BHXc.shape[0], alpha_BSl1.shape[1]
        l = q_BHXc.shape[2] // (S + 1)
        if q_BHXc.dtype != k.dtype:
            q_BHXc = q_BHXc.to(k.dtype)
        out = F.scaled_dot_product_attention(
            q_BHXc, k, v, attn_mask=mask_XlL, dropout_p=self.dropout if self.training else 0.0, scale=self.scale
        )
        out = out.transpose(1, 2).reshape(B, (S + 1) * l, self.dim)
        a_style_BSlC, a_content_BlC = out[:, : S * l].view(B, S, l, self.dim), out[:, S * l:]
        delta_BSlC = alpha_BSl1.to(out.dtype) * (a_style_BSlC - a_content_BlC.unsqueeze(1))
        return self.proj(a_content_BlC + (delta_BSlC.squeeze(1) if S == 1 else delta_BSlC.sum(1)))
