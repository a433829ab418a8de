"""stylevar.models.sampling: the draw follows the filtered softmax, honours top-k and top-p, is reproducible per
generator, and is stable under small changes of the logits (each token's random number is its own)."""
from __future__ import annotations

import torch

from stylevar.models.sampling import candidates, make_generators, sample


def _filtered_reference(logits_V: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The target distribution written the slow, obvious way: sort, keep the top k, then the nucleus."""
    order = logits_V.argsort(descending=True)
    keep = torch.zeros_like(logits_V, dtype=torch.bool)
    keep[order[:top_k] if top_k else order] = True
    p = torch.where(keep, logits_V, torch.tensor(float("-inf"))).softmax(-1)
    sorted_p = p[order]
    tail = sorted_p.flip(0).cumsum(0).flip(0)  # mass of each token and all less likely ones
    drop_sorted = tail <= 1 - top_p if 0 < top_p < 1 else torch.zeros_like(tail, dtype=torch.bool)
    drop_sorted[0] = False
    p[order[drop_sorted]] = 0
    return p / p.sum()


def test_draws_follow_the_filtered_distribution():
    g = torch.Generator().manual_seed(0)
    logits_V = torch.randn(40, generator=g) * 1.5
    n = 60000
    for top_k, top_p in ((0, 0.0), (10, 0.0), (0, 0.8), (12, 0.9)):
        want = _filtered_reference(logits_V, top_k, top_p)
        tokens = sample(logits_V.expand(1, n, -1), make_generators(1, 1, logits_V.device), top_k, top_p)
        freq = torch.bincount(tokens.flatten(), minlength=40).float() / n
        assert (freq[want == 0] == 0).all(), (top_k, top_p)  # never outside the top-k or the nucleus
        # 5 standard errors of a binomial frequency at most
        assert ((freq - want).abs() <= 5 * (want * (1 - want) / n).sqrt() + 1e-9).all(), (top_k, top_p)


def test_candidates_are_the_top_k_and_the_nucleus():
    logits = torch.tensor([[[0.0, 3.0, 1.0, 2.0, -1.0]]])
    probs, idx = candidates(logits, top_k=3, top_p=0.0)
    assert set(idx.flatten().tolist()) == {1, 2, 3} and (probs > 0).all()
    probs, idx = candidates(logits, top_k=0, top_p=0.5)  # the best token alone holds more than half
    assert idx[0, 0, 0] == 1 and (probs[0, 0, 1:] == 0).all()
    probs, idx = candidates(logits, top_k=0, top_p=0.0)
    assert idx is None and torch.allclose(probs, logits.softmax(-1))


def test_one_generator_per_row_makes_rows_independent_of_each_other():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 20, 64, generator=g)
    both = sample(logits, make_generators([11, 12, 13], 3, logits.device), 16, 0.9)
    alone = sample(logits[1:2], make_generators([12], 1, logits.device), 16, 0.9)
    assert torch.equal(both[1:2], alone)
    again = sample(logits, make_generators([11, 12, 13], 3, logits.device), 16, 0.9)
    assert torch.equal(both, again)


def test_a_small_change_of_the_logits_rarely_changes_the_token():
    """Each vocabulary entry has its own random number, so a perturbation far below the logits' spread
    (bf16 against fp32) changes a draw only where two candidates were nearly tied."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(1, 4000, 512, generator=g)
    noisy = logits + 1e-3 * torch.randn(logits.shape, generator=g)
    a = sample(logits, make_generators(9, 1, logits.device), 400, 0.96)
    b = sample(noisy, make_generators(9, 1, logits.device), 400, 0.96)
    assert (a == b).float().mean() > 0.99
