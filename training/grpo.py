"""GRPO fine-tuning of StyleVAR with LoRA and a perceptual reward: ``python -m training.grpo``.

    python -m training.grpo --data MANIFEST --init MODEL_DIR --out RUN --reward dreamsim|lpips|clip|ssim|l1 \
        --group-size G --batch-size B --max-steps N [--lora-rank 256 --lora-alpha 512 ...]
    torchrun --nproc_per_node P -m training.grpo ...        # the same run on P processes

One step, for B triplets (content, style, target):
1. Rollouts: G samples per triplet from the current policy (LoRA on; top-k 900, top-p 0.96) in one
   batched ``generate`` call for all B * G rows (``--rollout-chunk`` rows at a time if memory needs it);
   row i of step s uses the seed derived from (seed, s, i), so a step is reproducible.
2. Reward R = -lambda * dist(generated, target) (training.rewards); advantage per group
   A = (R - mean_G R) / (std_G R + eps).
3. Log-probabilities of the sampled tokens by teacher forcing, in fp32 whatever ``--precision`` says
   (it only affects the rollouts): ``old`` (rollout policy, no grad), ``ref`` (LoRA disabled, no grad),
   ``new`` (with grad, once per ``--ppo-epochs``; ``old`` stays the one computed before the updates).
4. Per token: policy term -min(rho A, clip(rho, 1 - eps, 1 + eps) A) with rho = exp(new - old); KL k3 with
   d = ref - new: beta (exp(d) - 1 - d). PANW token weights w = (h_k w_k)^-gamma / Z (sum 1 over the L
   tokens). Loss = mean over rollouts of sum over tokens of w (policy + KL). AdamW on the LoRA matrices.
5. Iterative merge (``training.merge_control``): a reward EMA and the LoRA snapshot at its peak; when the
   EMA has beaten the last merge baseline by ``--merge-min-gain`` for ``--merge-patience`` steps and
   ``--merge-cooldown`` steps have passed since the last merge, the peak snapshot is baked into the
   base weights and LoRA restarts at zero (B = 0, A redrawn from (seed, merge count)), the optimizer
   state is cleared and the baseline becomes the peak EMA. An emergency merge (same procedure) happens
   when the raw KL exceeds ``--emergency-kl`` (own cooldown ``--emergency-cooldown``); a step whose
   raw KL in any group exceeds ``--skip-kl`` makes no update. Raw KL = the PANW-weighted token mean of
   k3(ref - old) (no beta), measured before the update; ``kl`` in the log is its mean over rollouts.

The model runs in eval mode throughout (no dropout; the encoders' norm statistics stay fixed), so
teacher forcing of the rollout policy reproduces its log-probabilities: at the first update old and
new are identical and every ratio is 1 (``ratio_dev`` in the log is max |rho - 1| of the first epoch).

``RUN/log.jsonl`` (every ``--log-every`` steps, means over the window; ``merged``/``skipped`` counts):
step, reward_mean, reward_std (over all rollouts), reward_group_std (mean within-group std), kl,
kl_group_max, loss, clip_frac (tokens with |rho - 1| > eps, last epoch), ratio_dev, grad_norm, merged,
emergency, skipped, reward_ema, lr, entropy_s{k} (policy entropy per scale), timings. TensorBoard gets
the same. Resume (model incl. LoRA and merged base, optimizer, merge state, data position, RNG) through
training.parts, the same parts SFT uses; ``RUN/final/`` is a plain model directory with LoRA
merged (any checkpoint: ``python -m training.merge_lora RUN``, also ``stylevar merge-lora RUN``).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from stylevar import hub
from stylevar.pull import resolve_model
from stylevar.lora import (LoRAConfig, attach_lora, load_lora_state_dict, lora_disabled, lora_parameters, merge_lora,
                           snapshot_lora, unload_lora)
from stylevar.devices import resolve_autocast_dtype
from stylevar.generation import DEFAULT_GENERATION
from stylevar.model_dir import ModelDirError, check_model_dir
from stylevar.pipeline import StylePipeline
from stylevar.transformer import Condition, StyleVAR
from training.data import check_data_args, collate_triplets, dataset_size, open_triplets
from training.merge_control import MergeConfig, MergeController
from training.optim import ScheduleConfig, make_adamw, two_level_scheduler
from training.parts import cli
from training.parts.checkpoints import CheckpointsUnreadableError
from training.parts.cli import add_loop_args, loop_config, recipe_parser
from training.parts.distributed import DistEnv, all_reduce_max, all_reduce_sum, setup_distributed, teardown_distributed
from training.parts.log import MetricWindow
from training.parts.precision import resolve_precision
from training.parts.rng import derived_generator
from training.parts.run import TrainingRun
from training.parts.rundir import RunDir
from training.parts.schedule import LoopConfig
from training.parts.scale_weights import panw_weights
from training.parts.state import TrainingState
from training.parts.streams import BatchStreamConfig, make_stream, move_to
from training.rewards import REWARDS, Reward, RewardConfig


# ------------------------------------------------------------------------------------------ math
def group_advantages(rewards_BG: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """(R - mean_G R) / (std_G R + eps) within each group (row); std is the unbiased sample std."""
    if rewards_BG.ndim != 2 or rewards_BG.shape[1] < 2:
        raise ValueError(f"advantages need (groups, G >= 2) rewards, got shape {tuple(rewards_BG.shape)}")
    mean = rewards_BG.mean(1, keepdim=True)
    std = rewards_BG.std(1, keepdim=True)
    return (rewards_BG - mean) / (std + eps)


def rollout_seed(seed: int, step: int, index: int) -> int:
    """The sampling seed of rollout `index` of step `step`, derived from (seed, step, index)."""
    return int(np.random.SeedSequence([seed, step, index]).generate_state(1, dtype=np.uint64)[0] >> 1)


def rollout_indices(local_triplets: int, group_size: int, rank: int = 0, world_size: int = 1) -> list[int]:
    """Global rollout indices of this rank's rows (triplet-major). Rank r's j-th triplet is position
    j * world_size + r of the global batch (see training.parts.streams.EpochShardSampler), so a triplet gets the same seeds
    whatever the number of processes."""
    return [(j * world_size + rank) * group_size + g for j in range(local_triplets) for g in range(group_size)]


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
    """The GRPO loss of N rollouts (or a chunk of them) and its logged parts.

    Per token: policy term -min(rho A, clip(rho, 1 - eps, 1 + eps) A), rho = exp(new - old), plus
    ``kl_beta`` * k3(ref - new); weighted by the PANW ``weights_L``, summed over the L tokens, summed over
    the rows and divided by ``num_rows`` (all rows of the step when this is a chunk; default N).
    Parts: ``clipped`` (tokens with |rho - 1| > eps) and ``ratio_dev`` (max |rho - 1|).
    """
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
    """log p of the sampled tokens (N, L) by fp32 teacher forcing, without grad (`old` and `ref`).

    `cond`: the rows' precomputed condition (LoRA leaves the encoders alone, so it is shared by every pass)."""
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


# ------------------------------------------------------------------------------------------ the step
@dataclass(frozen=True)
class GRPOConfig:
    group_size: int = 16  # G
    top_k: int = DEFAULT_GENERATION.top_k
    top_p: float = DEFAULT_GENERATION.top_p
    style_strength: float = 0.0
    clip_eps: float = 0.2
    kl_beta: float = 0.1
    panw_gamma: float = 0.7
    adv_eps: float = 1e-4
    ppo_epochs: int = 1
    max_grad_norm: float = 1.0
    rollout_chunk: int = 0  # rows per generate call (0: all rows of the step in one call)
    tf_chunk: int = 0  # rows per teacher-forcing forward/backward (0: all)
    batched_rollouts: bool = True  # False: one generate call per rollout (the reference's loop; benchmarks)
    seed: int = 0

    def __post_init__(self):
        if self.group_size < 2:
            raise ValueError(f"--group-size must be >= 2 (advantages are relative within a group), got {self.group_size}")
        if self.ppo_epochs < 1:
            raise ValueError("--ppo-epochs must be >= 1")
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"--clip-eps must be in (0, 1), got {self.clip_eps}")
        if self.kl_beta < 0 or self.adv_eps <= 0:
            raise ValueError("--kl-beta must be >= 0 and --adv-eps > 0")
        if self.rollout_chunk < 0 or self.tf_chunk < 0:
            raise ValueError("chunk sizes must be >= 0")


@dataclass
class Rollouts:
    """B triplets x G samples, rows ordered triplet-major (row b * G + g)."""

    content: torch.Tensor  # (N, 3, S, S) in [-1, 1]
    style: torch.Tensor
    tokens: list[torch.Tensor]  # K x (N, pn * pn)
    images: torch.Tensor  # (N, 3, S, S) in [0, 1]
    rewards: torch.Tensor  # (N,) CPU
    advantages: torch.Tensor  # (N,) on the device
    old: torch.Tensor | None = None  # (N, L)
    ref: torch.Tensor | None = None  # (N, L)
    cond: Condition | None = None  # the rows' condition, computed once per triplet (fp32)


class GRPOTrainer:
    """Rollouts, rewards, the clipped policy loss with KL and PANW, the optimizer step and merges."""

    def __init__(self, model: StyleVAR, reward: Reward, cfg: GRPOConfig, merge: MergeConfig,
                 optimizer: torch.optim.Optimizer, scheduler: Any, env: DistEnv):
        self.model, self.reward, self.cfg, self.env = model, reward, cfg, env
        self.optimizer, self.scheduler = optimizer, scheduler
        self.controller = MergeController(merge)
        self.params = lora_parameters(model)
        self.weights_L = panw_weights(model.cfg.patch_nums, cfg.panw_gamma).to(model.pos_1LC.device)
        self.patch_nums = tuple(model.cfg.patch_nums)

    # ---- rollouts ------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, content: torch.Tensor, style: torch.Tensor, seeds: list[int], cond: Condition | None = None
                 ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Images (N, 3, S, S) in [0, 1] and tokens for N rows with one seed each."""
        cfg, N = self.cfg, content.shape[0]
        kw = dict(top_k=cfg.top_k, top_p=cfg.top_p, style_strength=cfg.style_strength)
        step = (cfg.rollout_chunk or N) if cfg.batched_rollouts else 1
        images, tokens = [], []
        for s in range(0, N, step):
            img, idx = self.model.generate_with_indices(content[s:s + step], style[s:s + step], seed=seeds[s:s + step],
                                                        cond=None if cond is None else cond.rows(s, s + step), **kw)
            images.append(img.float())
            tokens.append(idx)
        return torch.cat(images), [torch.cat(t) for t in zip(*tokens)]

    def rollout(self, batch: Mapping[str, torch.Tensor], step: int) -> Rollouts:
        G, env = self.cfg.group_size, self.env
        content = batch["content"].repeat_interleave(G, 0)
        style = batch["style"].repeat_interleave(G, 0)
        if "target" not in batch:
            raise ValueError("GRPO needs paired triplets: the batch has no target images")
        seeds = [rollout_seed(self.cfg.seed, step, i)
                 for i in rollout_indices(batch["content"].shape[0], G, env.rank, env.world_size)]
        t0 = time.perf_counter()
        with torch.no_grad(), fp32_policy(self.model):  # once per triplet, shared by the G rows and every pass
            cond = self.model.condition(batch["content"], batch["style"]).repeat_interleave(G)
        images, tokens = self.generate(content, style, seeds, cond)
        t1 = time.perf_counter()
        target = batch["target"].repeat_interleave(G, 0).add(1).mul(0.5).clamp(0, 1)
        rewards = self.reward(images, content.add(1).mul(0.5).clamp(0, 1), style.add(1).mul(0.5).clamp(0, 1),
                              target).float().cpu()
        self.timing = {"t_rollout": t1 - t0, "t_reward": time.perf_counter() - t1}
        adv = group_advantages(rewards.view(-1, G), self.cfg.adv_eps).view(-1)
        return Rollouts(content, style, tokens, images, rewards, adv.to(content.device), cond=cond)

    # ---- policy terms -------------------------------------------------------------------------
    def reference_logprobs(self, r: Rollouts) -> None:
        """r.old (current policy) and r.ref (LoRA off), no grad, fp32."""
        kw = dict(style_strength=self.cfg.style_strength, chunk=self.cfg.tf_chunk, cond=r.cond)
        r.old = sampled_logprobs(self.model, r.content, r.style, r.tokens, **kw)
        with lora_disabled(self.model):
            r.ref = sampled_logprobs(self.model, r.content, r.style, r.tokens, **kw)

    def policy_pass(self, r: Rollouts, *, want_entropy: bool) -> dict[str, float]:
        """Forward + backward of the loss over all rows (chunked); returns the loss and diagnostics."""
        cfg, N = self.cfg, r.content.shape[0]
        step = cfg.tf_chunk or N
        w_L = self.weights_L
        loss_sum, clipped, ratio_dev = 0.0, 0.0, 0.0
        ent = torch.zeros(len(self.patch_nums), dtype=torch.float64)
        with fp32_policy(self.model):
            for s in range(0, N, step):
                e = min(s + step, N)
                idx = [t[s:e] for t in r.tokens]
                logits = self.model.teacher_forcing_logits(r.content[s:e], r.style[s:e], idx,
                                                           style_strength=cfg.style_strength,
                                                           cond=None if r.cond is None else r.cond.rows(s, e))
                new = token_logprobs(logits, torch.cat(idx, 1))
                loss, parts = grpo_loss(new, r.old[s:e], r.ref[s:e], r.advantages[s:e], w_L, clip_eps=cfg.clip_eps,
                                        kl_beta=cfg.kl_beta, num_rows=N)
                loss.backward()
                loss_sum += float(loss.detach())
                clipped += parts["clipped"]
                ratio_dev = max(ratio_dev, parts["ratio_dev"])
                if want_entropy:
                    with torch.no_grad():
                        ent += entropy_per_scale(logits.detach(), self.patch_nums).double().cpu() * (e - s)
                del logits, new, loss
        out = {"loss": loss_sum, "clip_frac": clipped / (N * w_L.numel()), "ratio_dev": ratio_dev}
        if want_entropy:
            out.update({f"entropy_s{k}": float(v) / N for k, v in enumerate(ent)})
        return out

    def _reduce(self, d: dict[str, float]) -> dict[str, float]:
        """Means over ranks (the max for ratio_dev): every rank has the same number of rollouts."""
        if not self.env.distributed:
            return d
        keys = [k for k in d if k != "ratio_dev"]
        mean = all_reduce_sum(torch.tensor([d[k] for k in keys], dtype=torch.float64), self.env) / self.env.world_size
        out = {k: float(v) for k, v in zip(keys, mean)}
        out["ratio_dev"] = all_reduce_max(d["ratio_dev"], self.env)
        return out

    def _sync_grads(self) -> None:
        """The LoRA gradients averaged over ranks in one all-reduce of one flat buffer (per element the same
        sum as an all-reduce per tensor)."""
        if not self.env.distributed:
            return
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in self.params]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat.div_(self.env.world_size)
        for g, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            g.copy_(reduced)

    def _merge(self, step: int, emergency: bool) -> None:
        """Bake the peak snapshot into the base weights, restart LoRA, clear the optimizer state."""
        c = self.controller
        if c.snapshot is not None:
            load_lora_state_dict(self.model, c.snapshot)
        g = derived_generator(self.cfg.seed, c.merges + 1, 0x10AA)
        merge_lora(self.model, restart=True, generator=g)
        self.optimizer.state.clear()
        c.merged(step, emergency, snapshot_lora(self.model))

    # ---- one step -----------------------------------------------------------------------------
    def step(self, batch: Mapping[str, torch.Tensor], step: int) -> dict[str, float]:
        """GRPO step number `step` (1-based) on this rank's share of the batch."""
        cfg, env, c = self.cfg, self.env, self.controller
        r = self.rollout(batch, step)
        self.last_tokens = r.tokens  # K x (N, pn * pn): what this step sampled (benchmarks, debugging)
        t0 = time.perf_counter()
        self.reference_logprobs(r)
        G = cfg.group_size
        kl_row = (self.weights_L * k3_kl(r.ref, r.old)).sum(-1).double().cpu()
        R = r.rewards.double()
        sums = torch.tensor([R.sum(), (R * R).sum(), float(R.numel()), kl_row.sum(),
                             R.view(-1, G).std(1).sum(), float(R.numel() // G)], dtype=torch.float64)
        tot = all_reduce_sum(sums, env)
        n = float(tot[2])
        reward_mean = float(tot[0]) / n
        reward_std = math.sqrt(max(float(tot[1]) / n - reward_mean**2, 0.0) * n / max(n - 1, 1))
        kl = float(tot[3]) / n
        group_kl_max = all_reduce_max(float(kl_row.view(-1, G).mean(1).max()), env)
        stats: dict[str, float] = {"reward_mean": reward_mean, "reward_std": reward_std,
                                   "reward_group_std": float(tot[4]) / float(tot[5]), "kl": kl,
                                   "kl_group_max": group_kl_max}

        c.observe(step, reward_mean, lambda: snapshot_lora(self.model))
        merged = emergency = skipped = 0
        if c.emergency_due(step, kl):
            self._merge(step, emergency=True)
            merged = emergency = skipped = 1  # the rollouts came from the pre-merge policy: no update
        elif c.skip_due(group_kl_max):
            skipped = 1
        else:
            for epoch in range(cfg.ppo_epochs):
                d = self._reduce(self.policy_pass(r, want_entropy=epoch == 0))
                self._sync_grads()
                norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm) if cfg.max_grad_norm > 0 \
                    else torch.tensor(float("nan"))
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                if epoch == 0:
                    stats.update({k: v for k, v in d.items() if k != "clip_frac"})
                    stats["grad_norm"] = float(norm)
                stats["clip_frac"] = d["clip_frac"]
            if c.merge_due(step):
                self._merge(step, emergency=False)
                merged = 1
        with warnings.catch_warnings():  # a skipped step steps the schedule without an optimizer step
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            self.scheduler.step()
        stats.update({"merged": merged, "emergency": emergency, "skipped": skipped, "reward_ema": float(c.ema),
                      "merges_total": c.merges, **self.timing, "t_policy": time.perf_counter() - t0})
        return stats


# ------------------------------------------------------------------------------------------ CLI
SUM_KEYS = ("merged", "emergency", "skipped")  # counted over a log window; the rest averaged
LAST_KEYS = ("reward_ema", "merges_total")  # their value at the logged step
# options that may change when a run is resumed (they do not change what is computed)
FREE_KEYS = (*cli.FREE_KEYS, "rollout_chunk", "tf_chunk")


def build_parser() -> argparse.ArgumentParser:
    p = recipe_parser("training.grpo", __doc__)
    p.add_argument("--init", required=True, metavar="MODEL_DIR",
                   help="model directory to start from (e.g. an SFT RUN/final), or a hub id hf:OWNER/NAME[:variant]")
    p.add_argument("--name", default="stylevar-grpo", help="model name written to RUN/final/config.json")
    g = p.add_argument_group("rollouts and reward")
    g.add_argument("--reward", choices=REWARDS, default="dreamsim", help="distance to the target the reward is made of (training.rewards)")
    g.add_argument("--reward-scale", type=float, default=5.0, help="lambda in R = -lambda * dist")
    g.add_argument("--reward-image-size", type=int, default=256, help="metric resolution (not for l1)")
    g.add_argument("--reward-style-weight", type=float, default=0.0,
                   help="w in dist + w * colour_swd(generated, style): a style-fidelity term (0: off)")
    g.add_argument("--lpips-net", choices=("vgg", "alex"), default="vgg", help="LPIPS backbone (--reward lpips)")
    g.add_argument("--group-size", type=int, default=16, help="G rollouts per triplet")
    g.add_argument("--top-k", type=int, default=DEFAULT_GENERATION.top_k, help="top-k of the rollouts' sampling (0: off)")
    g.add_argument("--top-p", type=float, default=DEFAULT_GENERATION.top_p, help="top-p of the rollouts' sampling (0 or 1: off)")
    g.add_argument("--style-strength", type=float, default=0.0, help="style strength of the rollouts, -1 .. 1")
    g.add_argument("--rollout-chunk", type=int, default=0, help="rows per generate call (0: all B*G at once)")
    g.add_argument("--tf-chunk", type=int, default=0, help="rows per teacher-forcing pass (0: all)")
    g = p.add_argument_group("policy loss")
    g.add_argument("--clip-eps", type=float, default=0.2, help="PPO clip range of the probability ratio")
    g.add_argument("--kl-beta", type=float, default=0.1, help="weight of the KL penalty against the LoRA-off reference")
    g.add_argument("--panw-gamma", type=float, default=0.7, help="PANW exponent: a token of scale k weighs (h_k w_k)^-gamma, normalised to sum 1")
    g.add_argument("--adv-eps", type=float, default=1e-4, help="added to the group's reward std when normalising advantages")
    g.add_argument("--ppo-epochs", type=int, default=1, help="optimizer steps per batch of rollouts")
    g = p.add_argument_group("LoRA and merging")
    g.add_argument("--lora-rank", type=int, default=256, help="rank of the LoRA adapters")
    g.add_argument("--lora-alpha", type=float, default=512.0, help="LoRA scale alpha (the update is alpha / rank x B A)")
    g.add_argument("--reward-ema", type=float, default=0.9, help="decay of the reward EMA")
    g.add_argument("--merge-min-gain", type=float, default=0.05, help="reward-EMA gain over the last merge that counts towards a merge")
    g.add_argument("--merge-patience", type=int, default=50, help="consecutive steps with that gain before a merge")
    g.add_argument("--merge-cooldown", type=int, default=300, help="steps between regular merges (0: none)")
    g.add_argument("--emergency-kl", type=float, default=2.0, help="raw KL above which the adapters are merged at once")
    g.add_argument("--emergency-cooldown", type=int, default=50, help="steps between emergency merges")
    g.add_argument("--skip-kl", type=float, default=5.0, help="a step whose group KL exceeds this makes no update")
    g.add_argument("--no-merge", action="store_true", help="never merge during training")
    add_loop_args(p, lr=1e-5, batch_size=4, max_grad_norm=1.0)
    p.set_defaults(weight_decay=0.01, log_every=1, save_every=50)
    return p


def check_inputs(args: argparse.Namespace) -> None:
    check_data_args(args.data)
    if hub.is_hub_id(args.init):  # a published model (hf:OWNER/NAME[:variant]): its model directory, pulled on first use
        try:
            args.init = str(resolve_model(args.init))
        except (hub.HubError, ValueError) as e:
            raise SystemExit(f"error: --init {args.init}: {e}") from None
    try:
        check_model_dir(args.init)
    except ModelDirError:
        raise SystemExit(f"error: --init {args.init}: not a model directory (config.json + *.safetensors)") from None
    except ValueError as e:
        raise SystemExit(f"error: --init {args.init}: {e}") from None
    if args.grad_accum != 1:
        raise SystemExit("error: --grad-accum is not used by GRPO; bound memory with --rollout-chunk and --tf-chunk")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_inputs(args)
    try:
        grpo_cfg = GRPOConfig(group_size=args.group_size, top_k=args.top_k, top_p=args.top_p,
                              style_strength=args.style_strength, clip_eps=args.clip_eps, kl_beta=args.kl_beta,
                              panw_gamma=args.panw_gamma, adv_eps=args.adv_eps, ppo_epochs=args.ppo_epochs,
                              max_grad_norm=args.max_grad_norm, rollout_chunk=args.rollout_chunk,
                              tf_chunk=args.tf_chunk, seed=args.seed)
        merge_cfg = MergeConfig(ema_decay=args.reward_ema, min_gain=args.merge_min_gain, patience=args.merge_patience,
                                cooldown=args.merge_cooldown, emergency_kl=args.emergency_kl,
                                emergency_cooldown=args.emergency_cooldown, skip_kl=args.skip_kl,
                                enabled=not args.no_merge)
        lora_cfg = LoRAConfig(rank=args.lora_rank, alpha=args.lora_alpha)
        reward_cfg = RewardConfig(args.reward, args.reward_scale, args.reward_image_size, args.lpips_net,
                                  style_weight=args.reward_style_weight)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    env = setup_distributed(args.device)
    try:
        return train(args, grpo_cfg, merge_cfg, lora_cfg, reward_cfg, env)
    except CheckpointsUnreadableError as e:
        raise SystemExit(f"error: {e}") from None
    finally:
        teardown_distributed()


def final_writer(model: StyleVAR, base_config: Any, args: argparse.Namespace) -> Callable[[Path], None]:
    """What writes RUN/final: the model with LoRA merged, as a plain model directory."""
    def write_final(folder: Path) -> None:
        unload_lora(model, merge=True)
        extra = {**base_config.extra, "recipe": "grpo", "init": str(args.init), "steps": args.max_steps,
                 "reward": args.reward, "group_size": args.group_size, "lora_rank": args.lora_rank,
                 "lora_alpha": args.lora_alpha}
        model_cfg = dataclasses.replace(base_config, name=args.name, demo=False, extra=extra)
        StylePipeline(model, model_cfg).save_pretrained(folder)
    return write_final


def grpo_steps(tr: TrainingRun, cfg: LoopConfig, trainer: GRPOTrainer, saved: Mapping[str, Any]) -> int:
    """The steps from ``tr.start`` to ``cfg.max_steps`` with their log lines and checkpoints (``saved``: what
    each checkpoint keeps besides the merge state); returns the last step."""
    log, start, env, stream = tr.log, tr.start, tr.env, tr.state.stream
    step = start
    window = MetricWindow(env, last=LAST_KEYS, summed=SUM_KEYS, over_ranks=False)  # stats agree on all ranks
    while step < cfg.max_steps:
        batch = move_to({k: v for k, v in stream.next().items() if k in ("content", "style", "target")}, env.device)
        lr = trainer.optimizer.param_groups[0]["lr"]
        stats = trainer.step(batch, step + 1)
        step += 1
        window.add(stats)
        if cfg.log_due(step):
            log.log(step, {**window.record(), "lr": lr})
            log.advance(step, {"reward": stats["reward_mean"], "kl": stats["kl"]})
        if step == start + 1 and step < cfg.max_steps:  # a first ETA after the first step
            log.info(tr.progress.line(step))
        if tr.checkpoint_due(step):
            tr.save(step, extra={"merge": trainer.controller.state_dict(), **saved})
    return step


def train(args: argparse.Namespace, grpo_cfg: GRPOConfig, merge_cfg: MergeConfig, lora_cfg: LoRAConfig,
          reward_cfg: RewardConfig, env: DistEnv) -> int:
    precision = resolve_precision(args.precision, env.device)
    if precision == "fp16":
        raise SystemExit("error: --precision fp16 is not supported for GRPO rollouts; use bf16 or fp32")
    config = {"recipe": "grpo", **vars(args)}
    run = RunDir.prepare(args.out, config, env, free_keys=FREE_KEYS)
    pipe = StylePipeline.from_pretrained(args.init, device=env.device)
    model = pipe.model
    model.autocast_dtype = resolve_autocast_dtype(precision, env.device)  # rollouts only (bf16 or None)
    dataset = open_triplets(args.data, "train", pipe.image_size, None, seed=args.seed, shuffle=True)
    reward = Reward(reward_cfg, env.device)  # missing metric weights fail here, before any work

    attach_lora(model, lora_cfg, seed=args.seed)
    model.eval()
    optimizer = make_adamw(model, args.lr, args.weight_decay, betas=(0.9, 0.95))
    scheduler = two_level_scheduler(optimizer, ScheduleConfig(max_steps=args.max_steps, warmup_steps=args.warmup_steps,
                                                              drop_factor=1.0))
    stream = make_stream(dataset, BatchStreamConfig(global_batch=args.batch_size, seed=args.seed,
                                                    num_workers=args.num_workers, collate_fn=collate_triplets), env)
    trainer = GRPOTrainer(model, reward, grpo_cfg, merge_cfg, optimizer, scheduler, env)
    state = TrainingState(model, optimizer, scheduler, stream, env)
    n_lora = sum(p.numel() for p in lora_parameters(model))
    cfg = loop_config(args, precision)
    with TrainingRun.for_loop(run, state, cfg) as tr:
        if tr.resumed.path is not None:
            trainer.controller.load_state_dict(tr.resumed.extra["merge"])
        tr.log.info(f"{dataset_size(dataset)} training triplets, {pipe.image_size}px, G={grpo_cfg.group_size}, "
                    f"batch {args.batch_size} ({args.batch_size * grpo_cfg.group_size} rollouts/step), reward "
                    f"{reward_cfg.name} x{reward_cfg.scale}, LoRA r={lora_cfg.rank} alpha={lora_cfg.alpha} "
                    f"({n_lora / 1e6:.3f}M trainable), world size {env.world_size}, rollouts {precision}")
        step = grpo_steps(tr, cfg, trainer, {"pipeline_config": pipe.config.to_dict(), "lora": lora_cfg.to_dict()})
        tr.finish(step, final_writer(model, pipe.config, args))
    return 0

if __name__ == "__main__":
    sys.exit(main())
