"""One GRPO step (``python -m training.grpo``, steps 1 to 5 of its docstring): :class:`GRPOTrainer` draws the
rollouts (seeded per row), scores them with the reward, takes the clipped policy loss with KL and PANW through
the optimizer, and merges the LoRA adapters when :class:`~training.grpo.merge_control.MergeController` says so."""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from stylevar.config import DEFAULT_GENERATION
from stylevar.models.lora import load_lora_state_dict, lora_disabled, lora_parameters, merge_lora, snapshot_lora
from stylevar.models.transformer import Condition, StyleVAR
from training.grpo.objective import (entropy_per_scale, fp32_policy, group_advantages, grpo_loss, k3_kl,
                                     sampled_logprobs, token_logprobs)
from training.grpo.merge_control import MergeConfig, MergeController
from training.parts.distributed import DistEnv, all_reduce_max, all_reduce_sum
from training.parts.rng import derived_generator
from training.parts.scale_weights import panw_weights
from training.grpo.rewards import Reward


def rollout_seed(seed: int, step: int, index: int) -> int:
    """The sampling seed of rollout `index` of step `step`, derived from (seed, step, index)."""
    return int(np.random.SeedSequence([seed, step, index]).generate_state(1, dtype=np.uint64)[0] >> 1)


def rollout_indices(local_triplets: int, group_size: int, rank: int = 0, world_size: int = 1) -> list[int]:
    """Global rollout indices of this rank's rows: a triplet's seeds whatever the number of processes."""
    return [(j * world_size + rank) * group_size + g for j in range(local_triplets) for g in range(group_size)]


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
        """The LoRA gradients averaged over ranks in one all-reduce of one flat buffer."""
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
