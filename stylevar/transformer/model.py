"""StyleVAR: predicts a target's token maps coarse to fine, conditioned on a content and a style image.

Three token streams share the embeddings (word_embed(code) + lvl_embed(level) + pos_1LC):
  target   the next-scale inputs built from the target's own f_hat (teacher forcing) or from what was
           sampled so far (generation); its first token is the content embedding (+ pos_start);
  style    the style image's cumulative f_hat at each scale's resolution (L tokens), fixed per image;
  content  the same for the content image.
Every block: target -> keys/values, style and content -> queries (level-causal), blended per scale by
alpha_k; AdaLN from the style embedding. With `cfg.content_injection` (an opt-in variant, off in the
published presets) the content stream is also added to the target's inputs through a zero-initialised
linear map (`content_in`). Read top to bottom: embeddings, block, head, teacher forcing,
generation.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from stylevar.config import StyleVARConfig
from stylevar.encoders import build_image_encoder, pooled
from stylevar.sampling import make_generators, sample
from stylevar.tokenizer import MultiScaleVQVAE
from stylevar.transformer.attention import BlendedAttention, KVCache


class FFN(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: StyleVARConfig):
        super().__init__()
        C = cfg.embed_dim
        self.dim, self.eps = C, cfg.norm_eps
        self.attn = BlendedAttention(C, cfg.num_heads, cfg.attn_l2_norm, cfg.dropout)
        self.ffn = FFN(C, round(C * cfg.mlp_ratio))
        self.ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(C, 6 * C))

    def modulation(self, cond_BD: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """AdaLN (g1, g2, s1, s2, b1, b2), each (B, 1, C); constant over a generation, so computed once."""
        return self.ada_lin(cond_BD).view(-1, 1, 6, self.dim).unbind(2)

    def forward(
        self,
        x_BLC: torch.Tensor,
        mod: tuple[torch.Tensor, ...],  # self.modulation(cond_BD)
        style_ln_BlC: torch.Tensor,  # LayerNorm'ed style tokens at the query positions
        content_ln_BlC: torch.Tensor,
        alpha_Bl1: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        g1, g2, s1, s2, b1, b2 = mod
        h = F.layer_norm(x_BLC, (self.dim,), eps=self.eps) * (1 + s1) + b1
        style = style_ln_BlC * (1 + s1) + b1
        content = content_ln_BlC * (1 + s1) + b1
        x_BLC = x_BLC + self.attn(h, style, content, alpha_Bl1, mask, cache) * g1
        h = F.layer_norm(x_BLC, (self.dim,), eps=self.eps) * (1 + s2) + b2
        return x_BLC + self.ffn(h) * g2


class AdaLNHead(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))

    def modulation(self, cond_BD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ada_lin(cond_BD).view(-1, 1, 2, self.dim).unbind(2)

    def forward(self, x_BLC: torch.Tensor, mod: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        scale, shift = mod
        return F.layer_norm(x_BLC, (self.dim,), eps=self.eps) * (1 + scale) + shift


@dataclass
class Condition:
    """What the two reference images contribute, computed once per (content, style) pair."""

    cond_BD: torch.Tensor  # style embedding: AdaLN input
    sos_B1C: torch.Tensor  # content embedding + pos_start: the first target token (before lvl/pos)
    style_ln_BLC: torch.Tensor  # LayerNorm'ed style token stream
    content_ln_BLC: torch.Tensor  # LayerNorm'ed content token stream
    inject_BLC: torch.Tensor | None = None  # content_in(content stream), added to the target inputs (variant)

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "Condition":
        fields = (getattr(self, f.name) for f in dataclasses.fields(self))  # not astuple: it deep-copies tensors
        return Condition(*(None if t is None else fn(t) for t in fields))

    def rows(self, start: int, end: int) -> "Condition":
        return self._map(lambda t: t[start:end])

    def repeat_interleave(self, n: int) -> "Condition":
        """Each row n times (the G rollouts of a group share their pair's condition)."""
        return self._map(lambda t: t.repeat_interleave(n, 0))

    def target_inputs(self, x_BlC: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """Target inputs at positions [start, end), plus the content injection when the model has one."""
        return x_BlC if self.inject_BLC is None else x_BlC + self.inject_BLC[:, start:end]


class StyleVAR(nn.Module):
    def __init__(self, cfg: StyleVARConfig, tokenizer: MultiScaleVQVAE):
        super().__init__()
        if tuple(tokenizer.cfg.patch_nums) != tuple(cfg.patch_nums) or tokenizer.cfg.vocab_size != cfg.vocab_size \
                or tokenizer.cfg.z_channels != cfg.z_channels:
            raise ValueError("tokenizer and transformer configs disagree on patch_nums, vocab_size or z_channels")
        self.cfg = cfg
        C, L, K = cfg.embed_dim, cfg.num_tokens, len(cfg.patch_nums)
        self.tokenizer = tokenizer.requires_grad_(False).eval()

        self.style_encoder = build_image_encoder(cfg.image_encoder, cfg.encoder_dim)
        self.content_encoder = build_image_encoder(cfg.image_encoder, cfg.encoder_dim)
        self.feat_emb = nn.Linear(cfg.encoder_dim, C)
        self.word_embed = nn.Linear(cfg.z_channels, C)
        first_l = cfg.patch_nums[0] ** 2
        self.pos_start = nn.Parameter(torch.zeros(1, first_l, C))
        self.pos_1LC = nn.Parameter(torch.zeros(1, L, C))
        self.lvl_embed = nn.Embedding(K, C)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.head_nm = AdaLNHead(C, cfg.norm_eps)
        self.head = nn.Linear(C, cfg.vocab_size)
        self.content_in = nn.Linear(C, C) if cfg.content_injection else None

        lvl_L = torch.cat([torch.full((pn * pn,), k) for k, pn in enumerate(cfg.patch_nums)])
        self.register_buffer("lvl_L", lvl_L, persistent=False)
        mask_LL = lvl_L[:, None] >= lvl_L[None, :]  # a query at level i sees keys of levels <= i
        self.register_buffer("mask_2LL", torch.cat([mask_LL, mask_LL]), persistent=False)
        self.register_buffer("alpha_K", torch.tensor(cfg.alpha_nums, dtype=torch.float32), persistent=False)
        self.autocast_dtype: torch.dtype | None = None  # e.g. torch.bfloat16 on CUDA
        self.activation_checkpointing = False  # recompute block activations in backward (training memory)
        self.reset_parameters()

    # ---- housekeeping -------------------------------------------------------------------------
    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """Fresh initialisation for training from scratch (loading a checkpoint overwrites it)."""
        for name, m in self.named_modules():
            if name.startswith("tokenizer"):
                continue
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=std)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.Embedding):
                nn.init.trunc_normal_(m.weight, std=std)
        for p in (self.pos_start, self.pos_1LC):
            nn.init.trunc_normal_(p, std=std)
        depth_scale = 1 / math.sqrt(2 * self.cfg.depth)
        for blk in self.blocks:
            blk.attn.proj.weight.mul_(depth_scale)
            blk.ffn.fc2.weight.mul_(depth_scale)
            blk.attn.v_bias.zero_()
            lin = blk.ada_lin[1]
            lin.weight.mul_(0.5)
            C = self.cfg.embed_dim
            lin.weight[: 2 * C].mul_(1e-3)  # gammas start small: blocks start close to identity
            lin.bias[: 2 * C].fill_(1e-3)
        self.head.weight.mul_(0.1)
        self.head_nm.ada_lin[1].weight.mul_(0.1)
        if self.content_in is not None:  # zero: training starts from the published computation
            nn.init.zeros_(self.content_in.weight)
            nn.init.zeros_(self.content_in.bias)

    def train(self, mode: bool = True):
        super().train(mode)
        self.tokenizer.eval()  # frozen: BatchNorm-free, but keep it deterministic regardless
        return self

    def transformer_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if not k.startswith("tokenizer.")}

    def load_transformer_state_dict(self, sd: dict[str, torch.Tensor], strict: bool = True):
        full = {f"tokenizer.{k}": v for k, v in self.tokenizer.state_dict().items()}
        full.update(sd)
        return self.load_state_dict(full, strict=strict)

    def _autocast(self, device: torch.device):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.autocast_dtype)

    def blend_alphas(self, alphas: Sequence[float] | torch.Tensor | None = None,
                     style_strength: float = 0.0) -> torch.Tensor:
        """Per-scale blend coefficients (K,): the config's, or `alphas`, shifted by 0.5 * style_strength."""
        if not -1.0 <= float(style_strength) <= 1.0:
            raise ValueError(f"style_strength must lie in [-1, 1], got {style_strength}")
        K = len(self.cfg.patch_nums)
        a = self.alpha_K if alphas is None else torch.as_tensor(alphas, dtype=torch.float32, device=self.alpha_K.device)
        if a.shape != (K,):
            raise ValueError(f"alphas must hold one value per scale ({K}), got shape {tuple(a.shape)}")
        if style_strength:
            a = (a + 0.5 * float(style_strength)).clamp(0.01, 0.99)
        return a

    # ---- conditioning -------------------------------------------------------------------------
    def lvl_pos(self) -> torch.Tensor:
        return self.lvl_embed(self.lvl_L).unsqueeze(0) + self.pos_1LC  # (1, L, C)

    def condition(self, content: torch.Tensor, style: torch.Tensor) -> Condition:
        with torch.no_grad():
            q = self.tokenizer.quantize
            style_tok = q.condition_tokens(self.tokenizer.encode(style)[1])
            content_tok = q.condition_tokens(self.tokenizer.encode(content)[1])
        lvl_pos = self.lvl_pos()
        C, eps = self.cfg.embed_dim, self.cfg.norm_eps
        style_ln = F.layer_norm(self.word_embed(style_tok) + lvl_pos, (C,), eps=eps)
        content_ln = F.layer_norm(self.word_embed(content_tok) + lvl_pos, (C,), eps=eps)
        cond_BD = self.feat_emb(pooled(self.style_encoder, style))
        sos = self.feat_emb(pooled(self.content_encoder, content)).unsqueeze(1) + self.pos_start
        inject = self.content_in(content_ln) if self.content_in is not None else None
        return Condition(cond_BD, sos, style_ln, content_ln, inject)

    def logits(self, x_BLC: torch.Tensor, head_mod: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.head(self.head_nm(x_BLC, head_mod)).float()

    # ---- teacher forcing ----------------------------------------------------------------------
    def teacher_forcing_logits(
        self,
        content: torch.Tensor | None,
        style: torch.Tensor | None,
        target_indices: list[torch.Tensor],
        *,
        alphas: Sequence[float] | torch.Tensor | None = None,
        style_strength: float = 0.0,
        cond: Condition | None = None,
    ) -> torch.Tensor:
        """Logits (B, L, V) float32 for every target token given the true coarser scales.

        `cond` (from `condition(content, style)`) may be passed instead of the images when it is reused.
        """
        with self._autocast(target_indices[0].device):
            cond = cond if cond is not None else self.condition(content, style)
            with torch.no_grad():
                x_in = self.tokenizer.quantize.next_scale_inputs(target_indices, self.tokenizer.latent_size)
            x = torch.cat([cond.sos_B1C.expand(x_in.shape[0], -1, -1), self.word_embed(x_in)], dim=1)
            x = cond.target_inputs(x + self.lvl_pos(), 0, self.cfg.num_tokens)
            alpha_1L1 = self.blend_alphas(alphas, style_strength)[self.lvl_L].view(1, -1, 1)
            for blk in self.blocks:
                args = (x, blk.modulation(cond.cond_BD), cond.style_ln_BLC, cond.content_ln_BLC, alpha_1L1,
                        self.mask_2LL)
                if self.activation_checkpointing and torch.is_grad_enabled():
                    x = torch.utils.checkpoint.checkpoint(blk, *args, use_reentrant=False)
                else:
                    x = blk(*args)
            return self.logits(x, self.head_nm.modulation(cond.cond_BD))

    # ---- generation ---------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        content: torch.Tensor,
        style: torch.Tensor,
        *,
        top_k: int = 900,
        top_p: float = 0.96,
        seed: int | Sequence[int] | None = None,
        style_strength: float = 0.0,
        alphas: Sequence[float] | torch.Tensor | None = None,
        on_scale: Callable[[int, torch.Tensor], None] | None = None,
        return_indices: bool = False,
        cond: Condition | None = None,
    ):
        """Sample the target coarse to fine. Images (B, 3, H, W) in [0, 1] (and the token maps).

        `cond` (from `condition(content, style)`) may be passed instead of the images when it is reused.
        """
        if cond is None and style.shape[0] != content.shape[0]:
            raise ValueError(f"content batch {content.shape[0]} and style batch {style.shape[0]} differ")
        B = cond.cond_BD.shape[0] if cond is not None else content.shape[0]
        device = cond.cond_BD.device if cond is not None else content.device
        generators = make_generators(seed, B, device)
        alpha_K = self.blend_alphas(alphas, style_strength)
        with self._autocast(device):
            cond = cond if cond is not None else self.condition(content, style)
            f_hat, indices = self.sample_tokens(cond, generators, alpha_K, top_k, top_p, on_scale)
            images = self.tokenizer.decode_fhat(f_hat).float().add(1).mul(0.5)
        return (images, indices) if return_indices else images

    @torch.no_grad()
    def sample_tokens(
        self,
        cond: Condition,
        generators: list[torch.Generator],
        alpha_K: torch.Tensor,
        top_k: int = 900,
        top_p: float = 0.96,
        on_scale: Callable[[int, torch.Tensor], None] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The autoregressive loop: f_hat (B, Cvae, n, n) and the K sampled token maps.

        The KV cache is preallocated and holds each target token once; AdaLN modulations are computed
        once, not per scale.
        """
        B, device = cond.cond_BD.shape[0], cond.cond_BD.device
        tok, patch_nums = self.tokenizer, self.cfg.patch_nums
        n = tok.latent_size
        lvl_pos = self.lvl_pos()
        dtype = lvl_pos.dtype if self.autocast_dtype is None else self.autocast_dtype
        caches = [KVCache(B, self.cfg.num_heads, self.cfg.num_tokens, self.cfg.head_dim, device, dtype)
                  for _ in self.blocks]
        mods = [blk.modulation(cond.cond_BD) for blk in self.blocks]
        head_mod = self.head_nm.modulation(cond.cond_BD)
        f_hat = torch.zeros(B, self.cfg.z_channels, n, n, device=device)
        x = cond.target_inputs(cond.sos_B1C.expand(B, -1, -1) + lvl_pos[:, : patch_nums[0] ** 2], 0, patch_nums[0] ** 2)
        indices, start = [], 0
        for k, pn in enumerate(patch_nums):
            end = start + pn * pn
            alpha = alpha_K[k].expand(B, pn * pn, 1)
            for blk, mod, cache in zip(self.blocks, mods, caches):
                x = blk(x, mod, cond.style_ln_BLC[:, start:end], cond.content_ln_BLC[:, start:end], alpha, None, cache)
            idx_Bl = sample(self.logits(x, head_mod), generators, top_k, top_p)
            indices.append(idx_Bl)
            f_hat = f_hat + tok.quantize.upsampled_residual(k, idx_Bl, n).float()
            if on_scale is not None:
                on_scale(k, tok.decode_fhat(f_hat).float().add(1).mul(0.5))
            if k + 1 < len(patch_nums):
                nxt = patch_nums[k + 1]
                x = cond.target_inputs(self.word_embed(tok.quantize.area_tokens(f_hat, nxt))
                                       + lvl_pos[:, end:end + nxt * nxt], end, end + nxt * nxt)
            start = end
        return f_hat, indices
