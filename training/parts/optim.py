"""Optimizer parameter groups and the two-level learning-rate schedule with warmup (the paper's SFT: AdamW,
betas (0.9, 0.95), 5e-4 then 1e-4)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

# parameter-name fragments that never get weight decay (embeddings, start tokens, attention temperatures)
NO_DECAY_FRAGMENTS = ("pos_start", "pos_1LC", "lvl_embed", "class_emb", "scale_mul", "start_token", "pos_embed")
_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.InstanceNorm2d, nn.RMSNorm)


def decay_split(model: nn.Module, extra_no_decay: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """Names of trainable parameters (decay, no_decay); no decay: biases, 0-/1-d tensors, embeddings, norms and
    names containing NO_DECAY_FRAGMENTS or ``extra_no_decay``."""
    fragments = NO_DECAY_FRAGMENTS + tuple(extra_no_decay)
    owner_no_decay = set()
    for mod_name, mod in model.named_modules():
        if isinstance(mod, (nn.Embedding, *_NORMS)):
            for p_name, _ in mod.named_parameters(recurse=False):
                owner_no_decay.add(f"{mod_name}.{p_name}" if mod_name else p_name)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        leaf = name.rsplit(".", 1)[-1]
        if p.ndim <= 1 or leaf == "bias" or name in owner_no_decay or any(f in name for f in fragments):
            no_decay.append(name)
        else:
            decay.append(name)
    return decay, no_decay


def param_groups(model: nn.Module, weight_decay: float, extra_no_decay: Iterable[str] = ()) -> list[dict]:
    """AdamW parameter groups: [{params with decay}, {params without}] (empty groups dropped)."""
    decay, no_decay = decay_split(model, extra_no_decay)
    params = dict(model.named_parameters())
    groups = [
        {"params": [params[n] for n in decay], "weight_decay": weight_decay, "names": decay},
        {"params": [params[n] for n in no_decay], "weight_decay": 0.0, "names": no_decay},
    ]
    return [g for g in groups if g["params"]]


def make_adamw(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.95),
               eps: float = 1e-8, fused: bool | None = None) -> torch.optim.AdamW:
    groups = param_groups(model, weight_decay)
    for g in groups:
        g.pop("names")
    if not groups:
        raise ValueError("the model has no trainable parameters")
    if fused is None:  # the fused kernel when every parameter lives on a GPU (one launch per step)
        fused = all(p.is_cuda for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused)


@dataclass(frozen=True)
class ScheduleConfig:
    """lr(step) = base * min(1, (step + 1) / warmup_steps) * (1 before drop_step, drop_factor from it on);
    ``drop_step`` defaults to ``round(drop_fraction * max_steps)``."""

    max_steps: int
    warmup_steps: int = 0
    drop_step: int | None = None
    drop_fraction: float = 0.6
    drop_factor: float = 0.2

    def __post_init__(self):
        if self.max_steps < 1:
            raise ValueError("max_steps must be >= 1")
        if self.warmup_steps < 0:
            raise ValueError("warmup_steps must be >= 0")
        if not 0.0 <= self.drop_fraction <= 1.0:
            raise ValueError("lr drop fraction must be in [0, 1]")
        if self.drop_step is not None and self.drop_step < 0:
            raise ValueError("lr drop step must be >= 0")
        if self.drop_factor <= 0:
            raise ValueError("lr drop factor must be > 0")

    @property
    def resolved_drop_step(self) -> int:
        return self.drop_step if self.drop_step is not None else round(self.drop_fraction * self.max_steps)

    def factor(self, step: int) -> float:
        """Multiplier of the base lr for optimizer step ``step`` (0-based)."""
        warm = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else 1.0
        level = self.drop_factor if step >= self.resolved_drop_step else 1.0
        return warm * level


def two_level_scheduler(optimizer: torch.optim.Optimizer, cfg: ScheduleConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR following ``cfg`` (its state_dict loads with ``torch.load(weights_only=True)``)."""

    def factor(step: int) -> float:
        return cfg.factor(step)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
