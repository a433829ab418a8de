"""Dynamic batching: a bounded queue of jobs served by one worker thread per device.

A job carries a compatibility `key` (jobs with equal keys may share one model call) and a number of
`rows` it adds to the batch. Each worker takes the oldest waiting job, waits up to `max_wait_s` for
more jobs with the same key until `max_batch_size` rows are gathered, drops jobs whose client went
away or whose deadline passed, and calls its `run` function on the rest. The run function is a
dependency: the service passes the model, tests pass whatever they need (one that raises, one that
sleeps). A run that runs out of memory is split in halves and retried; a job that still does not fit
fails with `OverloadedError`. Any other exception fails that batch only: the worker goes on.
"""
from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch

P = TypeVar("P")  # what a job asks for
R = TypeVar("R")  # what the run function returns for one job

log = logging.getLogger("serve.batching")


class BatchError(Exception):
    """A job that could not be served. `code` is the short reason given to the client."""

    code = "batch_error"


class QueueFullError(BatchError):
    code = "queue_full"

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceededError(BatchError):
    code = "deadline_exceeded"


class OverloadedError(BatchError):
    """The job does not fit in device memory, even alone."""

    code = "out_of_memory"


class StoppedError(BatchError):
    code = "shutting_down"


class InferenceError(BatchError):
    """The run function raised for this job's batch; the cause is chained."""

    code = "inference_failed"


@dataclass(frozen=True)
class BatchConfig:
    max_batch_size: int = 8  # rows per run call (a single larger job still runs, alone)
    max_wait_s: float = 0.01  # how long the oldest job waits for company
    queue_size: int = 64  # jobs waiting, not counting the ones running


@dataclass(eq=False)
class Job(Generic[P, R]):
    key: Hashable
    rows: int
    payload: P
    deadline: float  # time.monotonic() after which the result is no use
    enqueued_at: float = field(default_factory=time.monotonic)
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    request_id: str | None = None
    started_at: float | None = None  # clock time the run call serving this job began / ended
    finished_at: float | None = None


RunFn = Callable[[Sequence[Job]], Sequence[Any]]


class BatchObserver(Protocol):
    """What the batcher reports (the service's metrics implement it)."""

    def queue_depth(self, depth: int) -> None: ...

    def batch_done(self, jobs: int, rows: int, seconds: float, ok: bool) -> None: ...

    def job_dropped(self, reason: str) -> None: ...

    def oom_split(self) -> None: ...


class NullObserver:
    def queue_depth(self, depth: int) -> None:
        pass

    def batch_done(self, jobs: int, rows: int, seconds: float, ok: bool) -> None:
        pass

    def job_dropped(self, reason: str) -> None:
        pass

    def oom_split(self) -> None:
        pass


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError)


def _free_cuda_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Batcher:
    """One shared bounded queue, one worker thread per run function (one per device)."""

    def __init__(
        self,
        runs: Sequence[RunFn],
        config: BatchConfig,
        *,
        observer: BatchObserver | None = None,
        is_oom: Callable[[BaseException], bool] = is_out_of_memory,
        on_oom: Callable[[], None] = _free_cuda_cache,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not runs:
            raise ValueError("Batcher needs at least one run function")
        self.config = config
        self._runs = list(runs)
        self._observer = observer or NullObserver()
        self._is_oom = is_oom
        self._on_oom = on_oom
        self._clock = clock
        self._pending: deque[Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._batch_seconds = 0.0  # moving average of one run call, for Retry-After

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self._threads:
            raise RuntimeError("batcher already started")
        for i, run in enumerate(self._runs):
            t = threading.Thread(target=self._worker, args=(run,), name=f"stylevar-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 30.0) -> None:
        """Refuse new jobs, fail the waiting ones, let running batches finish."""
        with self._cond:
            self._stopping = True
            waiting = list(self._pending)
            self._pending.clear()
            self._cond.notify_all()
        for job in waiting:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(StoppedError("the service is shutting down"))
        for t in self._threads:
            t.join(timeout)
        self._threads.clear()

    @property
    def depth(self) -> int:
        return len(self._pending)

    # -- producer side -----------------------------------------------------------------------------
    def submit(self, key: Hashable, payload: Any, *, rows: int = 1, timeout_s: float,
               request_id: str | None = None) -> Job:
        """Queue a job; its `future` gets the run function's result for it, or a BatchError."""
        if rows < 1:
            raise ValueError("a job has at least one row")
        now = self._clock()
        job = Job(key=key, rows=rows, payload=payload, deadline=now + timeout_s, enqueued_at=now,
                  request_id=request_id)
        with self._cond:
            if self._stopping:
                raise StoppedError("the service is shutting down")
            if len(self._pending) >= self.config.queue_size:
                self._purge_cancelled()
            if len(self._pending) >= self.config.queue_size:
                raise QueueFullError(
                    f"the queue is full ({self.config.queue_size} jobs waiting)", self._retry_after(len(self._pending))
                )
            self._pending.append(job)
            depth = len(self._pending)
            self._cond.notify_all()
        self._observer.queue_depth(depth)
        return job

    def _purge_cancelled(self) -> None:
        """Free the slots of jobs whose client went away (called with the lock held)."""
        for job in [j for j in self._pending if j.future.cancelled()]:
            self._pending.remove(job)
            self._observer.job_dropped("cancelled")

    def _retry_after(self, depth: int) -> int:
        batches_ahead = depth / self.config.max_batch_size + 1
        return max(1, math.ceil(self._batch_seconds * batches_ahead))

    # -- worker side -------------------------------------------------------------------------------
    def _worker(self, run: RunFn) -> None:
        while True:
            try:
                jobs = self._collect()
                if jobs is None:
                    return
                jobs = self._admit(jobs)
                if jobs:
                    self._execute(run, jobs)
            except Exception:  # the worker must survive anything; a bug here fails no job silently
                log.exception("batch worker error")

    def _collect(self) -> list[Job] | None:
        """Block until a batch is due; take it off the queue. None when stopping."""
        cfg = self.config
        with self._cond:
            while True:
                if self._stopping:
                    return None
                self._purge_cancelled()
                if not self._pending:
                    self._cond.wait()
                    continue
                first = self._pending[0]
                rows = sum(j.rows for j in self._pending if j.key == first.key)
                wait = first.enqueued_at + cfg.max_wait_s - self._clock()
                if rows < cfg.max_batch_size and wait > 0:
                    self._cond.wait(wait)
                    continue
                taken, rows = [], 0
                for job in list(self._pending):
                    if job.key != first.key:
                        continue
                    if taken and rows + job.rows > cfg.max_batch_size:
                        break
                    taken.append(job)
                    rows += job.rows
                for job in taken:
                    self._pending.remove(job)
                depth = len(self._pending)
                break
        self._observer.queue_depth(depth)
        return taken

    def _admit(self, jobs: list[Job]) -> list[Job]:
        """Drop jobs whose client went away or whose deadline passed; mark the rest running."""
        now = self._clock()
        admitted = []
        for job in jobs:
            if not job.future.set_running_or_notify_cancel():
                self._observer.job_dropped("cancelled")
                log.info("job dropped: client gone", extra={"request_id": job.request_id})
                continue
            if now > job.deadline:
                self._observer.job_dropped("deadline")
                job.future.set_exception(DeadlineExceededError("the request waited past its deadline"))
                continue
            admitted.append(job)
        return admitted

    def _execute(self, run: RunFn, jobs: list[Job]) -> None:
        rows = sum(j.rows for j in jobs)
        t0 = self._clock()
        for job in jobs:
            job.started_at = t0
        try:
            results = run(jobs)
            if len(results) != len(jobs):
                raise RuntimeError(f"run function returned {len(results)} results for {len(jobs)} jobs")
        except Exception as e:
            seconds = self._clock() - t0
            self._observer.batch_done(len(jobs), rows, seconds, ok=False)
            if self._is_oom(e):
                self._on_oom()
                if len(jobs) > 1:
                    self._observer.oom_split()
                    log.warning("out of memory with %d jobs (%d rows): splitting the batch", len(jobs), rows)
                    mid = len(jobs) // 2
                    for part in (jobs[:mid], jobs[mid:]):
                        live = self._still_due(part)
                        if live:
                            self._execute(run, live)
                    return
                log.error("out of memory on a single job of %d rows", rows,
                          extra={"request_id": jobs[0].request_id})
                jobs[0].future.set_exception(OverloadedError("the request does not fit in device memory now"))
                return
            log.exception("run failed for a batch of %d jobs", len(jobs),
                          extra={"request_ids": [j.request_id for j in jobs]})
            for job in jobs:
                err = InferenceError(f"inference failed: {type(e).__name__}")
                err.__cause__ = e
                job.future.set_exception(err)
            return
        t1 = self._clock()
        seconds = t1 - t0
        for job in jobs:
            job.finished_at = t1
        self._batch_seconds = seconds if self._batch_seconds == 0 else 0.8 * self._batch_seconds + 0.2 * seconds
        self._observer.batch_done(len(jobs), rows, seconds, ok=True)
        for job, result in zip(jobs, results):
            job.future.set_result(result)

    def _still_due(self, jobs: list[Job]) -> list[Job]:
        now = self._clock()
        live = []
        for job in jobs:
            if now > job.deadline:
                self._observer.job_dropped("deadline")
                job.future.set_exception(DeadlineExceededError("the request passed its deadline during retries"))
            else:
                live.append(job)
        return live
