"""When a recipe logs, validates and checkpoints (:class:`LoopConfig`, :class:`CheckpointSchedule`), and
how long is left (:class:`Progress`)."""
from __future__ import annotations

import datetime
import time
from dataclasses import dataclass
from typing import Callable

import torch

from training.parts.distributed import DistEnv, broadcast_


@dataclass(frozen=True)
class LoopConfig:
    """The settings of a recipe's step loop (:func:`training.parts.cli.loop_config` makes them from the options)."""

    max_steps: int
    save_every: int = 500
    save_every_minutes: float = 0.0  # also checkpoint when this much wall time has passed (0: off)
    max_minutes: float = 0.0  # stop (checkpoint, exit 0) once the loop has run this long (0: no budget)
    val_every: int = 0  # 0: validate only at the end
    log_every: int = 10
    keep_checkpoints: int = 3
    max_grad_norm: float = 2.0
    grad_accum: int = 1
    precision: str = "fp32"  # resolved: fp32 | bf16 | fp16
    progress: bool = True
    seed: int = 0

    def __post_init__(self):
        if self.max_steps < 1:
            raise ValueError("max_steps must be >= 1")
        if self.save_every < 1:
            raise ValueError("save_every must be >= 1")
        if not self.save_every_minutes >= 0:
            raise ValueError("save_every_minutes must be >= 0")
        if not self.max_minutes >= 0:
            raise ValueError("max_minutes must be >= 0")
        if self.log_every < 1:
            raise ValueError("log_every must be >= 1")

    def log_due(self, step: int) -> bool:
        """Whether ``step`` ends a log window (every ``log_every`` steps, and the last step)."""
        return step % self.log_every == 0 or step == self.max_steps

    def val_due(self, step: int) -> bool:
        """Whether to validate after ``step`` inside the loop (the last step's validation is the recipe's)."""
        return bool(self.val_every) and step % self.val_every == 0 and step != self.max_steps


class CheckpointSchedule:
    """A checkpoint every ``every_steps`` steps, once ``every_minutes`` have passed since the last (0: never by
    time), and at ``max_steps``; call :meth:`due` after each step and :meth:`saved` after writing."""

    def __init__(self, env: DistEnv, *, max_steps: int, every_steps: int, every_minutes: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        if every_steps < 1:
            raise ValueError("save_every must be >= 1")
        if not every_minutes >= 0:
            raise ValueError(f"save_every_minutes must be >= 0, got {every_minutes}")
        self.env, self.max_steps, self.every_steps = env, max_steps, every_steps
        self.every_s, self.clock = every_minutes * 60.0, clock
        self._last = clock()

    def due(self, step: int, agree: bool = True) -> bool:
        """``agree`` False: by steps only (the ranks do not compare clocks at this step)."""
        if step % self.every_steps == 0 or step >= self.max_steps:
            return True
        if self.every_s <= 0 or not agree:
            return False
        late = self.clock() - self._last >= self.every_s
        if self.env.distributed:
            flag = broadcast_(torch.tensor([1.0 if late else 0.0], device=self.env.device), self.env)
            late = bool(flag.item() > 0)
        return late

    def saved(self) -> None:
        self._last = self.clock()


class Progress:
    """Steps per second and the time left, leaving out the first ``warmup_steps``; :meth:`passed` notes each step."""

    def __init__(self, start_step: int, max_steps: int, clock: Callable[[], float] = time.monotonic,
                 warmup_steps: int = 1):
        self.start_step, self.max_steps, self.clock = start_step, max_steps, clock
        self.warmup_steps = max(warmup_steps, 1)
        self._t0 = clock()
        self._warm: float | None = None  # the clock when step start_step + warmup_steps had finished

    def elapsed_s(self) -> float:
        return self.clock() - self._t0

    def passed(self, step: int) -> None:
        if self._warm is None and step >= self.start_step + self.warmup_steps:
            self._warm = self.clock()

    def first_lines_due(self, step: int) -> bool:
        """The steps whose line a recipe prints unasked: the end of the warm-up, and as many steps later."""
        return step - self.start_step in (self.warmup_steps, 2 * self.warmup_steps)

    def line(self, step: int) -> str:
        """``step 120/600 (20%), 0.71 steps/s, about 11 min left (ends about 14:12)``."""
        head = f"step {step}/{self.max_steps} ({100 * step // self.max_steps}%)"
        done = step - self.start_step - self.warmup_steps
        seconds = self.clock() - self._warm if self._warm is not None else 0.0
        if done <= 0 or seconds <= 0:
            return f"{head}, estimating the time left..."
        rate = done / seconds
        left_s = (self.max_steps - step) / rate
        ends = datetime.datetime.now() + datetime.timedelta(seconds=left_s)
        return f"{head}, {rate:.3g} steps/s, about {format_duration(left_s)} left (ends about {ends:%H:%M})"


def format_duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``2.5 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
