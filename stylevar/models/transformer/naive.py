"""The naive blend: a direct transcription of the method (two cross-attention calls per block, full Q/K/V
projections, a cache grown by concatenation): the baseline of `stylevar bench --naive` and of the fast path's tests.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from stylevar.config import DEFAULT_GENERATION
from stylevar.models.sampling import make_generators, sample
from stylevar.models.transformer.block import Block
from stylevar.models.transformer.condition import Condition
from stylevar.models.transformer.model import StyleVAR


def _full_qkv(blk: Block, h_BLC: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a = blk.attn
    W = torch.cat([a.q_guide.weight, a.kv_target.weight])  # (3C, C): the full projection
    b = torch.cat([a.q_guide.bias, torch.zeros_like(a.v_bias), a.v_bias])
    B, L, C = h_BLC.shape
    q, k, v = F.linear(h_BLC, W, b).view(B, L, 3, a.heads, a.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    if a.l2_norm:
        q = F.normalize(q, dim=-1) * a.scale_mul_1H11.clamp_max(math.log(100.0)).exp()
        k = F.normalize(k, dim=-1)
    return q, k, v


def naive_block(blk: Block, x, cond_BD, style_ln_BSlC, content_ln, alpha_BSl1, mask_lL=None, caches=None):
    """One block as independent full cross-attention calls (each style, then the content), each with the full
    Q/K/V matrix and its own cache: out = sum_s alpha_s * out_s + (1 - sum_s alpha_s) * out_content."""
    g1, g2, s1, s2, b1, b2 = blk.modulation(cond_BD)  # recomputed at every call, as a transcription does
    h = F.layer_norm(x, (blk.dim,), eps=blk.eps) * (1 + s1) + b1
    streams = [*style_ln_BSlC.unbind(1), content_ln]
    outs = []
    for i, stream in enumerate(streams):
        _, k, v = _full_qkv(blk, h)  # the target, projected again for each call
        if caches is not None:
            if caches[i]:
                k, v = torch.cat([caches[i][0], k], dim=2), torch.cat([caches[i][1], v], dim=2)
            caches[i] = [k, v]
        q, _, _ = _full_qkv(blk, stream * (1 + s1) + b1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_lL, scale=blk.attn.scale)
        outs.append(blk.attn.proj(o.transpose(1, 2).flatten(2)))
    alphas = alpha_BSl1.unbind(1)
    blended = sum(a * o for a, o in zip(alphas, outs)) + (1 - sum(alphas)) * outs[-1]
    x = x + blended * g1
    h = F.layer_norm(x, (blk.dim,), eps=blk.eps) * (1 + s2) + b2
    return x + blk.ffn(h) * g2


@torch.no_grad()
def naive_teacher_forcing_logits(model: StyleVAR, content, style, target_indices) -> torch.Tensor:
    """`style`: one image batch or a `StyleBlend` (its per-token shares, as `StyleVAR` takes them)."""
    cond = model.condition(content, style)
    x_in = model.tokenizer.quantize.next_scale_inputs(target_indices, model.tokenizer.latent_size)
    x = torch.cat([cond.sos_B1C.expand(content.shape[0], -1, -1), model.word_embed(x_in)], dim=1) + model.lvl_pos()
    x = cond.target_inputs(x, 0, model.cfg.num_tokens)
    alpha = _alphas(model, cond, model.blend_alphas())
    mask = model.mask_2LL[: model.cfg.num_tokens]
    for blk in model.blocks:
        x = naive_block(blk, x, cond.adaln(), cond.style_ln_BSLC, cond.content_ln_BLC, alpha, mask)
    return model.logits(x, model.head_nm.modulation(cond.adaln()))


@torch.no_grad()
def naive_generate(model: StyleVAR, content, style, *, top_k=DEFAULT_GENERATION.top_k, top_p=DEFAULT_GENERATION.top_p,
                   seed=None) -> torch.Tensor:
    generators = make_generators(seed, content.shape[0], content.device)
    cond = model.condition(content, style)
    f_hat, _ = naive_sample_tokens(model, cond, generators, model.blend_alphas(), top_k, top_p)
    return model.tokenizer.decode_fhat(f_hat).add(1).mul(0.5)


def _tokens(adaln: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """The AdaLN input of positions [start, end): all of a (B, D) one, those rows of a per-token (B, L, D) one."""
    return adaln if adaln.ndim == 2 else adaln[:, start:end]


def _alphas(model: StyleVAR, cond: Condition, alpha_K: torch.Tensor) -> torch.Tensor:
    """(B|1, S, L, 1): alpha_k of each token's scale, times each style's share when the condition has them."""
    alpha_L = alpha_K[model.lvl_L]
    shares = cond.shares_BSL if cond.shares_BSL is not None else alpha_L.new_ones(1, 1, alpha_L.shape[0])
    return (alpha_L * shares).unsqueeze(-1)


@torch.no_grad()
def naive_sample_tokens(model: StyleVAR, cond: Condition, generators, alpha_K, top_k=DEFAULT_GENERATION.top_k,
                        top_p=DEFAULT_GENERATION.top_p):
    """The autoregressive loop of the naive blend: (f_hat, token maps), like StyleVAR.sample_tokens."""
    B, device = cond.cond_BD.shape[0], cond.cond_BD.device
    tok, patch_nums = model.tokenizer, model.cfg.patch_nums
    n = tok.latent_size
    lvl_pos = model.lvl_pos()
    caches: list[list] = [[[] for _ in range(cond.num_styles + 1)] for _ in model.blocks]  # one per attention call
    f_hat = torch.zeros(B, model.cfg.z_channels, n, n, device=device)
    x = cond.target_inputs(cond.sos_B1C.expand(B, -1, -1) + lvl_pos[:, : patch_nums[0] ** 2], 0, patch_nums[0] ** 2)
    alpha_BSL1 = _alphas(model, cond, alpha_K)
    indices, start = [], 0
    for k, pn in enumerate(patch_nums):
        end = start + pn * pn
        for blk, cache in zip(model.blocks, caches):
            x = naive_block(blk, x, _tokens(cond.adaln(), start, end), cond.style_ln_BSLC[:, :, start:end],
                            cond.content_ln_BLC[:, start:end], alpha_BSL1[:, :, start:end], None, cache)
        head_mod = model.head_nm.modulation(_tokens(cond.adaln(), start, end))
        idx_Bl = sample(model.logits(x, head_mod), generators, top_k, top_p)
        indices.append(idx_Bl)
        f_hat = f_hat + tok.quantize.upsampled_residual(k, idx_Bl, n)
        if k + 1 < len(patch_nums):
            nxt = patch_nums[k + 1]
            x = model.word_embed(tok.quantize.area_tokens(f_hat, nxt))
            x = cond.target_inputs(x + lvl_pos[:, end:end + nxt * nxt], end, end + nxt * nxt)
        start = end
    return f_hat, indices
