"""Top-k / top-p sampling of token logits with private generators (the global RNG is never touched).

`sample` draws each token as an exponential race over the candidates (the largest p_i / -log(u_i)), so a draw
hardly moves when the logits move a little; `keyed_uniforms` keys the race's numbers to positions for video.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import torch

_MASK32 = 0xFFFFFFFF
_ROUNDS = (0x2C1B3C6D, 0x297A2D39, 0x2DE8F4CB)  # odd multipliers below 2**31: int64 products never overflow


class TokenSampler(Protocol):
    """Draws one scale's tokens from its logits, (B, l, V) -> (B, l) int64, e.g. `stylevar.pipelines.coherence.FrameSampler`."""

    def __call__(self, logits_BlV: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor: ...


def candidates(logits_BlV: torch.Tensor, top_k: int = 0, top_p: float = 0.0
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(probs_BlK, idx_BlK)``: each position's top-k tokens, 0 outside the top-p nucleus (the most likely always
    stays); ``idx`` None when nothing is filtered; 0 switches a filter off."""
    logits_BlV = logits_BlV.float()
    V = logits_BlV.shape[-1]
    use_p = 0.0 < top_p < 1.0
    if 0 < top_k < V:
        logits_BlK, idx_BlK = logits_BlV.topk(top_k, dim=-1, sorted=use_p)
    elif use_p:
        logits_BlK, idx_BlK = logits_BlV.sort(dim=-1, descending=True)
    else:
        return logits_BlV.softmax(dim=-1), None
    probs_BlK = logits_BlK.softmax(dim=-1)
    if use_p:  # best first: drop a candidate when it and all worse ones weigh at most 1 - top_p
        cum_BlK = probs_BlK.cumsum(dim=-1)
        tail_BlK = cum_BlK[..., -1:] - cum_BlK + probs_BlK
        drop_BlK = tail_BlK <= 1.0 - top_p
        drop_BlK[..., 0] = False
        probs_BlK = probs_BlK.masked_fill(drop_BlK, 0.0)
    return probs_BlK, idx_BlK


def make_generators(seed: int | Sequence[int] | TokenSampler | None, batch: int, device: torch.device
                    ) -> list[torch.Generator] | TokenSampler:
    """One generator for the batch (an int or None), or one per row (B seeds); a `TokenSampler` as it is."""
    if callable(seed):
        return seed
    if seed is None or isinstance(seed, int):
        g = torch.Generator(device=device)
        g.manual_seed(int(seed) if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
        return [g]
    seeds = list(seed)
    if len(seeds) != batch:
        raise ValueError(f"got {len(seeds)} seeds for a batch of {batch}")
    return [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]


def uniforms(shape: tuple[int, int, int], generators: list[torch.Generator], device: torch.device) -> torch.Tensor:
    """(B, l, V) uniform numbers in [0, 1): all from the one generator, or row b from generator b."""
    if len(generators) == 1:
        return torch.rand(shape, generator=generators[0], device=device)
    return torch.stack([torch.rand(shape[1:], generator=g, device=device) for g in generators])


def sample(logits_BlV: torch.Tensor, generators: list[torch.Generator] | TokenSampler, top_k: int = 0,
           top_p: float = 0.0) -> torch.Tensor:
    """Sample one token per position, (B, l) int64 (module doc). With one generator the batch is drawn in
    one call; with one per row, row b's draws come from generator b alone; a `TokenSampler` draws itself."""
    if callable(generators):
        return generators(logits_BlV, top_k, top_p)
    probs_BlK, idx_BlK = candidates(logits_BlV, top_k, top_p)
    u_BlV = uniforms(tuple(logits_BlV.shape), generators, logits_BlV.device)
    u_BlK = u_BlV if idx_BlK is None else u_BlV.gather(-1, idx_BlK)
    return race(probs_BlK, idx_BlK, u_BlK)


def race(probs_BlK: torch.Tensor, idx_BlK: torch.Tensor | None, u_BlK: torch.Tensor) -> torch.Tensor:
    """The exponential race's winner among the candidates (`candidates`' output) given their uniforms: (B, l)."""
    pick_Bl1 = (probs_BlK / -u_BlK.log()).argmax(dim=-1, keepdim=True)  # u = 0: an infinite draw, never picked
    return pick_Bl1.squeeze(-1) if idx_BlK is None else idx_BlK.gather(-1, pick_Bl1).squeeze(-1)


def hash32(x: torch.Tensor) -> torch.Tensor:
    """An integer hash of int64 tensors to [0, 2**32), without overflow on any device."""
    x = x & _MASK32
    for c in _ROUNDS:
        x = x ^ (x >> 16)
        x = (x * c) & _MASK32
    return x ^ (x >> 15)


def position_keys(seed: int, scale: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The key of each token position (integer grid coordinates ``x``, ``y``, any shape) at ``scale``."""
    base = int(hash32(torch.tensor([(seed & _MASK32) ^ (scale * 0x9E3779B1 & _MASK32)]))[0])
    return hash32(hash32(x ^ base) ^ (y * 0x61C88647 & _MASK32))


def keyed_uniforms(keys_Bl: torch.Tensor, idx_BlK: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Uniforms in [0, 1) for the candidates ``idx_BlK`` (every entry when None): a hash of (position key,
    entry) alone, so a position with the same key draws the same numbers in every call (24 bits each)."""
    entries = torch.arange(vocab_size, device=keys_Bl.device)
    entry_keys = hash32(entries * 0x2545F491 + 0x3C6EF372)  # (V,)
    ek = entry_keys.expand(*keys_Bl.shape, vocab_size) if idx_BlK is None else entry_keys[idx_BlK]
    return (hash32(keys_Bl.unsqueeze(-1) ^ ek) >> 8).float() * (1.0 / (1 << 24))


def keyed_sample(logits_BlV: torch.Tensor, keys_Bl: torch.Tensor, top_k: int = 0, top_p: float = 0.0) -> torch.Tensor:
    """`sample` with `keyed_uniforms`' numbers: each position's draw depends on its key alone."""
    probs_BlK, idx_BlK = candidates(logits_BlV, top_k, top_p)
    return race(probs_BlK, idx_BlK, keyed_uniforms(keys_Bl, idx_BlK, logits_BlV.shape[-1]))
