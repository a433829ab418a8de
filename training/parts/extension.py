"""Training a run longer: which changes of ``--max-steps`` (and of the options that place the learning-rate
drop) a re-run may make to a finished or stopped run (:class:`RunExtension`, checked by
:meth:`~training.parts.rundir.RunDir.prepare`).

The rule: the learning-rate schedule is the new command's, and a re-run may change those options only where
the new schedule gives every step the run has already taken the rate it was trained with. Then the extended
run is the run its new command would have made uninterrupted (the same losses, step for step); any other
change would leave steps trained at a rate their run's config does not say, and is refused with the option
that keeps the old rate. ``training.vqvae`` (no drop) and ``training.grpo`` (a drop factor of 1) always
extend; ``training.sft`` extends freely until its drop (0.6 x --max-steps by default), and after it with
``--lr-drop-step`` set to where the drop was.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from training.parts.optim import ScheduleConfig

SCHEDULE_KEYS = ("max_steps", "lr_drop_step", "lr_drop_fraction")  # the run's length and where its rate drops


@dataclass(frozen=True)
class RunExtension:
    """``schedule(options)``: the learning-rate schedule a recipe's options (``vars(args)``, or the run's
    config.json) give; the recipe builds its scheduler from the same function."""

    schedule: Callable[[Mapping[str, Any]], ScheduleConfig]
    keys: tuple[str, ...] = SCHEDULE_KEYS

    def problem(self, old: Mapping[str, Any], new: Mapping[str, Any], steps_done: int) -> str:
        """Why ``new`` may not continue the run of ``old`` that has taken ``steps_done`` steps ("" when it may)."""
        before, after = self.schedule(old), self.schedule(new)
        changed = next((s for s in range(steps_done) if before.factor(s) != after.factor(s)), None)
        if changed is None:
            return ""
        return (f"it has trained {steps_done} steps with the learning-rate drop at step {before.resolved_drop_step}; "
                f"the new options (--max-steps {after.max_steps}) put the drop at step {after.resolved_drop_step}, "
                f"which changes the rate of step {changed + 1}, already trained. Add --lr-drop-step "
                f"{before.resolved_drop_step} to keep the drop where it was")
