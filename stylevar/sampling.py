"""Top-k / top-p sampling of token logits with private generators (the global RNG is never touched)."""
from __future__ import annotations

from typing import Sequence

import torch


def filter_logits(logits_BlV: torch.Tensor, top_k: int = 0, top_p: float = 0.0) -> torch.Tensor:
    """Mask logits outside the top-k and outside the top-p nucleus with -inf (0 switches a filter off)."""
    V = logits_BlV.shape[-1]
    logits_BlV = logits_BlV.float().clone()
    if 0 < top_k < V:
        kth = logits_BlV.topk(top_k, dim=-1, sorted=False).values.amin(dim=-1, keepdim=True)
        logits_BlV.masked_fill_(logits_BlV < kth, float("-inf"))
    if 0.0 < top_p < 1.0:
        sorted_logits, sorted_idx = logits_BlV.sort(dim=-1, descending=False)
        # drop the low-probability tail whose mass is at most 1 - top_p; always keep the top token
        drop_sorted = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= (1.0 - top_p)
        drop_sorted[..., -1] = False
        drop = torch.zeros_like(drop_sorted).scatter_(-1, sorted_idx, drop_sorted)
        logits_BlV.masked_fill_(drop, float("-inf"))
    return logits_BlV


def make_generators(seed: int | Sequence[int] | None, batch: int, device: torch.device) -> list[torch.Generator]:
    """One generator for the batch (int or None -> random seed), or one per row (a sequence of B seeds)."""
    if seed is None or isinstance(seed, int):
        g = torch.Generator(device=device)
        g.manual_seed(int(seed) if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
        return [g]
    seeds = list(seed)
    if len(seeds) != batch:
        raise ValueError(f"got {len(seeds)} seeds for a batch of {batch}")
    return [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]


def sample(logits_BlV: torch.Tensor, generators: list[torch.Generator], top_k: int = 0, top_p: float = 0.0) -> torch.Tensor:
    """Sample one token per position, (B, l) int64. With one generator the batch is drawn in one call."""
    B, l, V = logits_BlV.shape
    probs_BlV = filter_logits(logits_BlV, top_k, top_p).softmax(dim=-1)
    if len(generators) == 1:
        return torch.multinomial(probs_BlV.view(-1, V), 1, generator=generators[0]).view(B, l)
    return torch.stack(
        [torch.multinomial(probs_BlV[b], 1, generator=g).view(l) for b, g in enumerate(generators)]
    )
