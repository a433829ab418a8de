"""Ctrl-C (SIGINT), SIGTERM or the end of a time budget (``--max-minutes``) during a recipe's step loop: the loop
ends its current step, writes a checkpoint there and exits with one line saying how to resume (:class:`StopSignals`,
used by :class:`~training.parts.run.TrainingRun`)."""
from __future__ import annotations

import signal
import threading
import time
from types import FrameType
from typing import Any, Callable

import torch

from training.parts.distributed import DistEnv, broadcast_

CAUGHT = (signal.SIGINT, signal.SIGTERM)
# why a loop stops after a step, as rank 0 broadcasts it (a float: the value travels as a tensor)
GO_ON, BY_SIGNAL, OUT_OF_TIME = 0.0, 1.0, 2.0


class StopSignals:
    """While entered in the main thread, the first SIGINT or SIGTERM is only recorded (the loop checkpoints and
    stops); a second one gets the earlier handler. ``budget_s``: also stop after that many seconds (status 0)."""

    def __init__(self, budget_s: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.received: int | None = None
        self.out_of_time = False
        self._before: dict[int, Any] = {}
        self.budget_s, self.clock = budget_s, clock
        self._deadline = float("inf")

    def __enter__(self) -> "StopSignals":
        if self.budget_s > 0:
            self._deadline = self.clock() + self.budget_s
        if threading.current_thread() is threading.main_thread():
            self._before = {sig: signal.signal(sig, self._handle) for sig in CAUGHT}
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._before.items():
            signal.signal(sig, handler)
        self._before = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        signal.signal(signum, self._before.get(signum, signal.SIG_DFL))  # the next one acts at once

    def agreed(self, env: DistEnv) -> bool:
        """Whether to stop after this step: rank 0's answer, on every rank."""
        why = BY_SIGNAL if self.received is not None else OUT_OF_TIME if self.clock() >= self._deadline else GO_ON
        if env.distributed:
            why = float(broadcast_(torch.tensor([why], device=env.device), env).item())
            if why == BY_SIGNAL and self.received is None:
                self.received = signal.SIGTERM
        self.out_of_time = why == OUT_OF_TIME
        return why != GO_ON

    def line(self, step: int, max_steps: int, checkpoint: str) -> str:
        """The one line said when the loop stops after the checkpoint of ``step``."""
        if self.out_of_time:
            return (f"stopped at the time budget ({self.budget_s / 60:g} min) after step {step} of {max_steps}: wrote "
                    f"{checkpoint}; run the same command again to continue from step {step}")
        name = signal.Signals(self.received or signal.SIGINT).name
        return (f"stopped by {name} after step {step} of {max_steps}: wrote {checkpoint}; run the same command "
                f"again to resume from step {step} (with a larger --max-steps to train longer)")

    def status(self) -> int:
        """The exit status, the shell's for the signal: 130 for SIGINT, 143 for SIGTERM; 0 at the time budget."""
        return 0 if self.out_of_time else 128 + int(self.received or signal.SIGINT)
