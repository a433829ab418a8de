"""Top-k / top-p sampling of token logits with private generators (the global RNG is never touched).

`sample` draws one token per position from the softmax of the logits restricted to the top-k and then to
the top-p nucleus, as an exponential race: every vocabulary entry i gets a uniform number u_i, in
vocabulary order, and the token is the candidate with the largest p_i / -log(u_i) (the -log(u_i) are
independent Exp(1) draws, so candidate i wins with probability p_i / sum p). A token's draw does not depend
on the other tokens' logits, so a small change of the logits (bf16 or int8 against fp32) rarely changes
the token. It costs one uniform per entry (`torch.multinomial` draws an exponential per entry, about six
times slower on the CPU), and the filtering works on the k best candidates only: `topk` gives them sorted,
so the nucleus needs no sort of the whole vocabulary.
"""
from __future__ import annotations

from typing import Sequence

import torch


def candidates(logits_BlV: torch.Tensor, top_k: int = 0, top_p: float = 0.0
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each position's candidates and their sampling probabilities, unnormalised: ``(probs_BlK, idx_BlK)``,
    the top-k tokens (best first when top_p filters), with probability 0 outside the top-p nucleus (the
    least likely candidates whose mass together is at most 1 - top_p; the most likely one always stays).
    ``idx`` is None when nothing is filtered (every token a candidate, in vocabulary order). 0 switches a
    filter off."""
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


def uniforms(shape: tuple[int, int, int], generators: list[torch.Generator], device: torch.device) -> torch.Tensor:
    """(B, l, V) uniform numbers in [0, 1): all from the one generator, or row b from generator b."""
    if len(generators) == 1:
        return torch.rand(shape, generator=generators[0], device=device)
    return torch.stack([torch.rand(shape[1:], generator=g, device=device) for g in generators])


def sample(logits_BlV: torch.Tensor, generators: list[torch.Generator], top_k: int = 0, top_p: float = 0.0) -> torch.Tensor:
    """Sample one token per position, (B, l) int64 (module doc). With one generator the batch is drawn in
    one call; with one per row, row b's draws come from generator b alone."""
    probs_BlK, idx_BlK = candidates(logits_BlV, top_k, top_p)
    u_BlV = uniforms(tuple(logits_BlV.shape), generators, logits_BlV.device)
    u_BlK = u_BlV if idx_BlK is None else u_BlV.gather(-1, idx_BlK)
    pick_Bl1 = (probs_BlK / -u_BlK.log()).argmax(dim=-1, keepdim=True)  # u = 0: an infinite draw, never picked
    return pick_Bl1.squeeze(-1) if idx_BlK is None else idx_BlK.gather(-1, pick_Bl1).squeeze(-1)
