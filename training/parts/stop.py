"""Ctrl-C (SIGINT) and SIGTERM during a recipe's step loop: the loop ends its current step, writes a checkpoint
there and exits with one line saying how to resume (:class:`StopSignals`, used by
:class:`~training.parts.run.TrainingRun`)."""
from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

import torch

from training.parts.distributed import DistEnv, broadcast_

CAUGHT = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """While entered (in the main thread), the first SIGINT or SIGTERM only records itself (:attr:`received`):
    the loop asks :meth:`agreed` after each step, checkpoints and stops (:meth:`exit`). A second signal gets the
    handler that was there before (Ctrl-C twice: the usual KeyboardInterrupt, at once). Leaving restores the
    earlier handlers. Outside the main thread (a recipe called from a test's worker thread) nothing is caught."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._before: dict[int, Any] = {}

    def __enter__(self) -> "StopSignals":
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
        """Whether to stop after this step: rank 0's answer on every rank (torchrun passes a signal on to every
        process, and the ranks must checkpoint at the same step)."""
        stop = self.received is not None
        if env.distributed:
            stop = bool(broadcast_(torch.tensor([1.0 if stop else 0.0], device=env.device), env).item() > 0)
            if stop and self.received is None:
                self.received = signal.SIGTERM
        return stop

    def line(self, step: int, max_steps: int, checkpoint: str) -> str:
        """The one line said when the loop stops after the checkpoint of ``step``."""
        name = signal.Signals(self.received or signal.SIGINT).name
        return (f"stopped by {name} after step {step} of {max_steps}: wrote {checkpoint}; run the same command "
                f"again to resume from step {step} (with a larger --max-steps to train longer)")

    def status(self) -> int:
        """The exit status, the shell's for the signal: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + int(self.received or signal.SIGINT)
