"""The SFT step's inputs from the frozen tokenizer: the target's token maps and the style's and content's token
streams, from one encode of the three image batches or from a `training.parts.token_cache.TokenCache`, made into
the model's `Condition` without encoding any image again: term for term `StyleVAR.condition(content, style)`'s
single-style case.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from stylevar.models.tokenizer import MultiScaleVQVAE
from stylevar.models.transformer import Condition, StyleVAR

ROLES = ("target", "style", "content")  # the order of the three images in a fused encode and in the cache


@dataclass
class TripletTokens:
    """The tokenizer's view of B triplets."""

    target: list[torch.Tensor]  # K token maps, each (B, pn * pn) int64
    style_BLc: torch.Tensor  # the style's condition tokens (B, L, Cvae): each scale's cumulative f_hat, area-resized
    content_BLc: torch.Tensor  # the same for the content


def indices_3BL(maps: list[torch.Tensor], batch: int) -> torch.Tensor:
    """K token maps of the 3B images (target, style, content rows) as one (B, 3, L) tensor (the cache's rows)."""
    return torch.cat(maps, dim=1).view(3, batch, -1).transpose(0, 1)


@torch.no_grad()
def encode_triplets(tokenizer: MultiScaleVQVAE, target: torch.Tensor, style: torch.Tensor,
                    content: torch.Tensor) -> tuple[TripletTokens, torch.Tensor]:
    """The three image batches through the tokenizer in one fp32 call, and their token maps (B, 3, L)."""
    B = target.shape[0]
    with torch.autocast(target.device.type, enabled=False):
        maps, f_hats = tokenizer.encode(torch.cat([target, style, content]).float())
        quantize = tokenizer.quantize
        style_BLc = quantize.condition_tokens([f[B:2 * B] for f in f_hats])
        content_BLc = quantize.condition_tokens([f[2 * B:] for f in f_hats])
    return TripletTokens([m[:B] for m in maps], style_BLc, content_BLc), indices_3BL(maps, B)


@torch.no_grad()
def tokens_from_indices(tokenizer: MultiScaleVQVAE, idx_B3L: torch.Tensor) -> TripletTokens:
    """The same from stored token maps (B, 3, L) (target, style, content), encoding no image."""
    B = idx_B3L.shape[0]
    sizes = [pn * pn for pn in tokenizer.cfg.patch_nums]
    idx_B3L = idx_B3L.long()
    target = list(idx_B3L[:, 0].split(sizes, dim=1))
    guide_maps = list(idx_B3L[:, 1:].transpose(0, 1).reshape(2 * B, -1).split(sizes, dim=1))  # style rows, content rows
    with torch.autocast(idx_B3L.device.type, enabled=False):
        quantize = tokenizer.quantize
        tokens_2BLc = quantize.condition_tokens(quantize.indices_to_fhats(guide_maps, tokenizer.latent_size))
    return TripletTokens(target, tokens_2BLc[:B], tokens_2BLc[B:])


def condition_from_tokens(model: StyleVAR, content: torch.Tensor, style: torch.Tensor,
                          tokens: TripletTokens) -> Condition:
    """`model.condition(content, style)` (one style per row) from the given token streams."""
    cond_BD = model.style_embedding(style)
    style_ln_B1LC = model.token_stream_ln(tokens.style_BLc).unsqueeze(1)
    sos_B1C, content_ln_BLC, inject, _ = model.content_parts(content, tokens_BLc=tokens.content_BLc)
    return Condition(cond_BD, sos_B1C, style_ln_B1LC, content_ln_BLC, inject)
