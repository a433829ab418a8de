"""One invocation of a recipe on RUN/, around the recipe's own step loop (:class:`TrainingRun`)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from stylevar.utils.atomic import DISK_FULL_ERRNOS, WriteFailedError, atomic_folder
from stylevar.runtime.distributed import leave_process_group
from training.parts.checkpoints import CheckpointManager, CheckpointsUnreadableError
from training.parts.distributed import DistEnv, main_rank_write, setup_distributed
from training.parts.log import RunLogger
from training.parts.rundir import RunConfigMismatchError, RunDir
from training.parts.schedule import CheckpointSchedule, LoopConfig, Progress, format_duration
from training.parts.state import TrainingState, resume
from training.parts.stop import StopSignals


class LossWatch:
    """The first step whose loss was not finite, noted on the device (no host sync) and read by :meth:`check`,
    which stops the run: checked before every checkpoint and log line, so no checkpoint holds a diverged step."""

    def __init__(self) -> None:
        self._step: torch.Tensor | None = None  # 0-d int64 on the loss's device: 0 while every loss was finite
        self._loss: torch.Tensor | None = None

    def note(self, step: int, loss: torch.Tensor | float) -> None:
        loss = torch.as_tensor(loss)
        first_bad = ~torch.isfinite(loss) & (True if self._step is None else self._step == 0)
        self._step = torch.where(first_bad, step, 0 if self._step is None else self._step)
        self._loss = torch.where(first_bad, loss, loss if self._loss is None else self._loss)

    def check(self, rank: int, checkpoints: Path) -> None:
        if self._step is None or not int(self._step):
            return
        raise FloatingPointError(
            f"loss is {float(self._loss)} at step {int(self._step)} on rank {rank}; lower --lr or check the data "
            f"(re-running resumes from the last checkpoint in {checkpoints})")


class TrainingRun:
    """One invocation of a recipe on RUN/: resume, checkpoints, and ``RUN/final`` (renamed into place by rank 0). A
    failed write ends the run naming the last good checkpoint; SIGINT/SIGTERM checkpoint and exit (130 / 143).

        with TrainingRun(run, state, max_steps=N, save_every=..., seed=...) as tr:
            step = tr.start
            while step < N:
                ...; step += 1                                    # one optimizer step
                if tr.checkpoint_due(step):
                    tr.save(step, extra={...})
            tr.finish(step, write_final)                          # write_final(folder) on rank 0
    """

    def __init__(self, run: RunDir, state: TrainingState, *, max_steps: int, save_every: int,
                 save_every_minutes: float = 0.0, keep: int = 3, seed: int = 0, progress: bool = True,
                 max_minutes: float = 0.0, clock: Callable[[], float] = time.monotonic, agree_every: int = 1,
                 warmup_steps: int = 1):
        self.run, self.state, self.env = run, state, state.env
        self.max_steps, self.save_every, self.save_every_minutes = max_steps, save_every, save_every_minutes
        self.seed, self.show_progress, self.clock = seed, progress, clock
        self.agree_every = agree_every  # processes agree on a stop or a timed checkpoint every this many steps
        self.warmup_steps = warmup_steps  # the steps the time left leaves out
        self.progress = Progress(0, max_steps, clock=clock, warmup_steps=warmup_steps)  # from the resumed step: _start
        self.ckpts = CheckpointManager(run.checkpoints, self.env, keep=keep)
        self.stop, self.stopping = StopSignals(max_minutes * 60, clock), False
        self.losses = LossWatch()

    @classmethod
    def for_loop(cls, run: RunDir, state: TrainingState, cfg: LoopConfig,
                 clock: Callable[[], float] = time.monotonic) -> "TrainingRun":
        """The run of a loop configured by ``cfg`` (:func:`loop_config`)."""
        return cls(run, state, max_steps=cfg.max_steps, save_every=cfg.save_every,
                   save_every_minutes=cfg.save_every_minutes, keep=cfg.keep_checkpoints, seed=cfg.seed,
                   progress=cfg.progress, max_minutes=cfg.max_minutes, clock=clock, agree_every=cfg.log_every,
                   warmup_steps=cfg.log_every)

    def __enter__(self) -> "TrainingRun":
        try:
            self._start()
        except OSError as e:
            stop = self._disk_exit(e)
            if stop is None:
                raise
            raise stop from None
        self.stop.__enter__()
        return self

    def _start(self) -> None:
        """Resume, open the log, and start the checkpoint schedule and the progress clock."""
        self.resumed = resume(self.ckpts, self.state, self.seed)
        self.start = self.resumed.step
        self.log = RunLogger(self.run, self.env, total_steps=self.max_steps, start_step=self.start,
                             progress=self.show_progress)
        stream = self.state.stream
        if self.start:
            self.log.info(f"resumed from step {self.start} (epoch {stream.epoch}, batch {stream.index})")
        for note in self.resumed.notes:
            self.log.info(note)
        if self.start >= self.max_steps:
            self.log.info(f"already at step {self.start} >= --max-steps {self.max_steps}")
        self.schedule = CheckpointSchedule(self.env, max_steps=self.max_steps, every_steps=self.save_every,
                                           every_minutes=self.save_every_minutes, clock=self.clock)
        self.progress = Progress(self.start, self.max_steps, clock=self.clock, warmup_steps=self.warmup_steps)

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: Any) -> None:
        self.stop.__exit__()
        try:
            self.log.close()
        except OSError:
            if exc is None:
                raise  # a failing close while another error propagates would only hide that one
        stop = self._disk_exit(exc) if exc is not None else None
        if stop is not None:
            raise stop from None

    def _disk_exit(self, exc: BaseException) -> SystemExit | None:
        """The one-line exit for a write that failed during the run (None for any other error)."""
        if isinstance(exc, WriteFailedError):
            message = str(exc)
        elif isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:  # e.g. appending to the log
            message = f"cannot write in {self.run.root}: disk full ({exc.strerror})"
        else:
            return None
        return SystemExit(f"error: {message}. {self.ckpts.last_good_note()}")

    def checkpoint_due(self, step: int) -> bool:
        """Whether ``step`` ends with a checkpoint, the same on every rank: rank 0's signals and clock are
        broadcast every ``agree_every`` steps and at the last step."""
        self.progress.passed(step)
        agree = not self.env.distributed or step % self.agree_every == 0 or step >= self.max_steps
        self.stopping = agree and self.stop.agreed(self.env) and step < self.max_steps
        return self.stopping or self.schedule.due(step, agree=agree)

    def save(self, step: int, extra: Mapping[str, Any] | None = None) -> None:
        """The checkpoint of ``step`` (every rank calls it); after a stop signal, the resume line and the exit."""
        self.losses.check(self.env.rank, self.run.checkpoints)
        state = self.state
        sharded = {"write_sharded": state.write_sharded} if state.sharded else {}
        path = self.ckpts.save(step, state.state_dict(step, extra), **sharded)
        self.schedule.saved()
        if self.stopping:
            self.log.info(self.stop.line(step, self.max_steps, str(path)))
            raise SystemExit(self.stop.status())
        if step < self.max_steps and path is not None:
            self.log.info(f"checkpoint {path.name}; {self.progress.line(step)}")

    def finish(self, step: int, write_final: Callable[[Path], None] | None) -> None:
        """The summary line; then ``write_final(folder)`` on rank 0 makes ``RUN/final`` (unless already there)."""
        self.losses.check(self.env.rank, self.run.checkpoints)
        if step > self.start:
            self.log.info(f"trained steps {self.start + 1}-{step} in {format_duration(self.progress.elapsed_s())}")
        if write_final is None or (self.start >= self.max_steps and self.run.final.exists()):
            return

        def write() -> None:
            with atomic_folder(self.run.final, what="model folder") as tmp:
                write_final(tmp)
            self.log.info(f"wrote {self.run.final}")

        main_rank_write(self.env, write)


def on_every_process(device: str | None, train: Callable[[DistEnv], int]) -> int:
    """``train(env)`` in this process of the run; input errors (another run's RUN/, no checkpoint) are one line."""
    env = setup_distributed(device)
    try:
        code = train(env)
        env.barrier()  # every rank has finished before any leaves the group (gloo aborts a rank otherwise)
        return code
    except (CheckpointsUnreadableError, RunConfigMismatchError) as e:
        raise SystemExit(f"error: {e}") from None
    finally:
        leave_process_group()
