"""When GRPO merges its LoRA adapters into the base weights (training.grpo, step 5 of its docstring): a reward
EMA and the LoRA snapshot at its peak, regular merges after a sustained gain, emergency merges on a high
KL, and steps skipped when a group's KL is too high."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch


@dataclass(frozen=True)
class MergeConfig:
    ema_decay: float = 0.9  # reward EMA: ema = decay * ema + (1 - decay) * reward_mean
    min_gain: float = 0.05  # EMA must beat the last merge baseline by this much ...
    patience: int = 50  # ... for this many consecutive steps
    cooldown: int = 300  # and this many steps since the last merge (0 disables regular merges: see enabled)
    emergency_kl: float = 2.0  # raw KL above this forces a merge ...
    emergency_cooldown: int = 50  # ... at most once per this many steps
    skip_kl: float = 5.0  # a step with a group's raw KL above this makes no update
    enabled: bool = True  # False: never merge (KL skip still applies)

    def __post_init__(self):
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"reward EMA decay must be in [0, 1), got {self.ema_decay}")
        if self.patience < 1 or self.cooldown < 0 or self.emergency_cooldown < 0:
            raise ValueError("merge patience must be >= 1 and cooldowns >= 0")


class MergeController:
    """Decides when to merge LoRA into the base and keeps the reward EMA and the peak snapshot."""

    def __init__(self, cfg: MergeConfig):
        self.cfg = cfg
        self.ema: float | None = None
        self.baseline: float | None = None  # EMA value the next merge must beat (EMA at start / last merge)
        self.peak = -math.inf  # best EMA since the last merge (or before)
        self.peak_step = 0
        self.snapshot: dict[str, torch.Tensor] | None = None  # LoRA state when the EMA peaked
        self.streak = 0  # consecutive steps with ema >= baseline + min_gain
        self.last_merge = 0
        self.last_emergency: int | None = None
        self.merges = 0

    def observe(self, step: int, reward_mean: float, snapshot_fn) -> None:
        """Feed the mean reward of `step`'s rollouts; `snapshot_fn()`: their LoRA state (called at a new EMA peak)."""
        d = self.cfg.ema_decay
        self.ema = reward_mean if self.ema is None else d * self.ema + (1 - d) * reward_mean
        if self.baseline is None:
            self.baseline = self.ema
        if self.ema > self.peak:
            self.peak, self.peak_step, self.snapshot = self.ema, step, snapshot_fn()
        self.streak = self.streak + 1 if self.ema >= self.baseline + self.cfg.min_gain else 0

    def emergency_due(self, step: int, kl: float) -> bool:
        if not self.cfg.enabled or not kl > self.cfg.emergency_kl:
            return False
        return self.last_emergency is None or step - self.last_emergency >= self.cfg.emergency_cooldown

    def skip_due(self, group_kl_max: float) -> bool:
        return not group_kl_max <= self.cfg.skip_kl  # NaN skips too

    def merge_due(self, step: int) -> bool:
        return self.cfg.enabled and self.streak >= self.cfg.patience and step - self.last_merge >= self.cfg.cooldown

    def merged(self, step: int, emergency: bool, snapshot_after: dict[str, torch.Tensor]) -> None:
        """Record a merge of the peak snapshot; the restarted (zero) LoRA now is the peak state."""
        self.merges += 1
        self.baseline = self.peak
        self.streak = 0
        self.last_merge = step
        if emergency:
            self.last_emergency = step
        self.peak_step, self.snapshot = step, snapshot_after

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema, "baseline": self.baseline, "peak": self.peak, "peak_step": self.peak_step,
                "snapshot": self.snapshot, "streak": self.streak, "last_merge": self.last_merge,
                "last_emergency": self.last_emergency, "merges": self.merges}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for k in ("ema", "baseline", "peak", "peak_step", "snapshot", "streak", "last_merge", "last_emergency", "merges"):
            setattr(self, k, state[k])
