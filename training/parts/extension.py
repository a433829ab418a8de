"""Training a run longer: which changes of ``--max-steps`` (and of the options that place the learning-rate drop) a
re-run may make to a run (:class:`RunExtension`, applied by :meth:`~training.parts.rundir.RunDir.prepare`).

A re-run may change them only where every step already taken keeps its rate; a drop already passed stays where
it was (:meth:`RunExtension.settle`); any other such change is refused, naming the option that keeps the rate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from training.parts.optim import ScheduleConfig

SCHEDULE_KEYS = ("max_steps", "lr_drop_step", "lr_drop_fraction")  # the run's length and where its rate drops


@dataclass(frozen=True)
class RunExtension:
    """``schedule(options)``: the learning-rate schedule of options (as :meth:`settle` returns them)."""

    schedule: Callable[[Mapping[str, Any]], ScheduleConfig]
    keys: tuple[str, ...] = SCHEDULE_KEYS

    def settle(self, old: Mapping[str, Any], new: Mapping[str, Any], steps_done: int) -> tuple[dict[str, Any], str]:
        """The options the run of ``old`` continues with under ``new``, and a line saying what was kept ("" when
        nothing): a drop that would move under an already trained step stays where ``old`` had it."""
        before = self.schedule(old)
        placed = "lr_drop_step" not in new or new["lr_drop_step"] is not None  # by the new command, or no drop option
        after = self.schedule(new)
        if placed or self._changed(before, after, steps_done) is None:
            return dict(new), ""
        kept = {**new, "lr_drop_step": before.resolved_drop_step}
        if (self._changed(before, self.schedule(kept), steps_done) is not None
                or old.get("lr_drop_step") == kept["lr_drop_step"]):
            return kept, ""  # still changed: problem() says why; already kept by an earlier re-run: said then
        moved = after.resolved_drop_step
        return kept, (f"learning-rate drop kept at step {before.resolved_drop_step}, where this run had it: it has "
                      f"trained {steps_done} steps, and --max-steps {kept['max_steps']} alone would put the drop at "
                      f"step {moved} (--lr-drop-step places it, at a step not yet trained)")

    def problem(self, old: Mapping[str, Any], new: Mapping[str, Any], steps_done: int) -> str:
        """Why ``new`` (from :meth:`settle`) may not continue ``old`` after ``steps_done`` steps ("" when it may)."""
        before, after = self.schedule(old), self.schedule(new)
        changed = self._changed(before, after, steps_done)
        if changed is None:
            return ""
        given = ", ".join(f"--{k.replace('_', '-')} {new[k]}" for k in ("max_steps", "lr_drop_step")
                          if new.get(k) is not None)
        return (f"it has trained {steps_done} steps with the learning-rate drop at step {before.resolved_drop_step}; "
                f"the new options ({given}) put the drop at step {after.resolved_drop_step}, which changes the rate "
                f"of step {changed + 1}, already trained. Leave out --lr-drop-step (or set it to "
                f"{before.resolved_drop_step}) to keep the drop where it was")

    @staticmethod
    def _changed(before: ScheduleConfig, after: ScheduleConfig, steps_done: int) -> int | None:
        """The first trained step (0-based) whose rate ``after`` changes from ``before`` (None: none)."""
        return next((s for s in range(steps_done) if before.factor(s) != after.factor(s)), None)
