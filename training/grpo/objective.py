"""The terms of GRPO's loss (``python -m training.grpo``): group-relative advantages, the log-probabilities of
sampled tokens by fp32 teacher forcing, the k3 KL estimate, the clipped policy term, their PANW-weighted sum
(:func:`grpo_loss`) and the policy's entropy per scale."""
from __future__ import annotations

import contextlib
from typing import Sequence

import torch

from stylevar.models.transformer import Condition, StyleVAR


def group_advantages(rewards_BG: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """(R - mean_G R) / (std_G R + eps) within each group (row); std is the unbiased sample std."""
    if rewards_BG.ndim != 2 or rewards_BG.shape[1] < 2:
        raise ValueError(f"advantages need (groups, G >= 2) rewards, got shape {tuple(rewards_BG.shape)}")
    mean = rewards_BG.mean(1, keepdim=True)
    std = rewards_BG.std(1, keepdim=True)
    return (rewards_BG - mean) / (std + eps)


def token_logprobs(logits_NLV: torch.Tensor, tokens_NL: torch.Tensor) -> torch.Tensor:
    """log p(token) under the full softmax, (N, L)."""
    return logits_NLV.gather(-1, tokens_NL.unsqueeze(-1)).squeeze(-1) - logits_NLV.logsumexp(-1)


def k3_kl(ref_NL: torch.Tensor, pol_NL: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pol || ref) per token: exp(d) - 1 - d with d = ref - pol."""
    d = ref_NL - pol_NL
    return torch.expm1(d) - d  # expm1 keeps small KLs from cancelling to 0 in fp32


def clipped_policy_loss(new_NL: torch.Tensor, old_NL: torch.Tensor, adv_N: torch.Tensor,
                        clip_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token -min(rho A, clip(rho, 1 - eps, 1 + eps) A) and rho, (N, L) each."""
    ratio = torch.exp(new_NL - old_NL)
    a = adv_N.unsqueeze(1)
    return -torch.minimum(ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a), ratio


def grpo_loss(new_NL: torch.Tensor, old_NL: torch.Tensor, ref_NL: torch.Tensor, adv_N: torch.Tensor,
              weights_L: torch.Tensor, *, clip_eps: float, kl_beta: float, num_rows: int | None = None
              ) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO loss of N rollouts (or a chunk) and its logged parts: per token -min(rho A, clip(rho) A) plus
    ``kl_beta`` * k3, weighted by ``weights_L``, summed and divided by ``num_rows`` (default N)."""
    pg, ratio = clipped_policy_loss(new_NL, old_NL, adv_N, clip_eps)
    kl = k3_kl(ref_NL, new_NL)
    per_row = (weights_L * (pg + kl_beta * kl)).sum(-1)
    loss = per_row.sum() / (num_rows or new_NL.shape[0])
    with torch.no_grad():
        dev = (ratio - 1).abs()
        parts = {"clipped": float((dev > clip_eps).float().sum()), "ratio_dev": float(dev.max())}
    return loss, parts


def entropy_per_scale(logits_NLV: torch.Tensor, patch_nums: Sequence[int]) -> torch.Tensor:
    """Mean entropy (nats) of the token distributions of each scale, (K,)."""
    logp = logits_NLV.log_softmax(-1)
    h_NL = -(logp.exp() * logp).sum(-1)
    return torch.stack([h.mean() for h in h_NL.split([pn * pn for pn in patch_nums], dim=1)])


@contextlib.contextmanager
def fp32_policy(model: StyleVAR):
    """Teacher forcing in fp32: the model's own autocast off, and any outer autocast too."""
    saved = model.autocast_dtype
    model.autocast_dtype = None
    try:
        with torch.autocast(model.pos_1LC.device.type, enabled=False):
            yield
    finally:
        model.autocast_dtype = saved


def sampled_logprobs(model: StyleVAR, content: torch.Tensor, style: torch.Tensor, tokens: list[torch.Tensor],
                     *, style_strength: float = 0.0, chunk: int = 0, cond: Condition | None = None) -> torch.Tensor:
    """log p of the sampled tokens (N, L) by fp32 teacher forcing, without grad; `cond`: the rows' condition."""
    N = content.shape[0]
    step = chunk or N
    out = []
    with torch.no_grad(), fp32_policy(model):
        for s in range(0, N, step):
            idx = [t[s:s + step] for t in tokens]
            logits = model.teacher_forcing_logits(content[s:s + step], style[s:s + step], idx,
                                                  style_strength=style_strength,
                                                  cond=None if cond is None else cond.rows(s, s + step))
            out.append(token_logprobs(logits, torch.cat(idx, 1)))
    return torch.cat(out)
