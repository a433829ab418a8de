"""Dynamic batching: a bounded queue of jobs served by one worker thread per device.

Jobs with equal `key`s may share one `run` call of up to `max_batch_size` rows; a worker waits up to
`max_wait_s` for company. A batch that runs out of memory is split in halves and retried; a job that still
does not fit fails with `OverloadedError`. `admit()` holds a queue slot (or refuses at once with
`QueueFullError`) while the caller decodes its inputs; a cancelled job leaves the queue at once.
"""
from __future__ import annotations

import concurrent.futures
import gc
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch

from stylevar.utils.errors import CodedError

P = TypeVar("P")  # what a job asks for
R = TypeVar("R")  # what the run function returns for one job

log = logging.getLogger("serve.engine.batching")


class BatchError(CodedError):
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


def lower_priority(nice: int) -> None:
    """Lower the calling thread's CPU priority by `nice` (Linux: per thread); a no-op at 0 or where unsupported."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
    except OSError as e:
        log.warning("could not lower the batch worker's priority (%s)", e)


@dataclass(frozen=True)
class BatchConfig:
    max_batch_size: int = 8  # rows per run call (a single larger job still runs, alone)
    max_wait_s: float = 0.01  # how long the oldest job waits for company
    queue_size: int = 64  # jobs waiting, not counting the ones running
    max_queue_wait_s: float | None = None  # refuse a job whose estimated wait is longer; None: no bound
    worker_nice: int = 0  # Linux nice of the workers (and the torch threads they start)


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
    """What the batcher reports; `queue_depth` is called with its lock held (quick, no calls back)."""

    def queue_depth(self, depth: int) -> None: ...

    def batch_done(self, jobs: int, rows: int, seconds: float, ok: bool) -> None: ...

    def job_dropped(self, reason: str) -> None: ...

    def oom_split(self) -> None: ...


class NullObserver(BatchObserver):
    """Reports nothing (the protocol's methods, each a no-op)."""


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError)


def free_device_memory() -> None:
    """After an out-of-memory error has been dropped: collect cycles, then empty the CUDA cache (no-op without CUDA)."""
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


def attempt(fn: Callable[[], R], is_oom: Callable[[BaseException], bool] = is_out_of_memory) -> tuple[bool, R | None]:
    """``(True, fn())``, or ``(False, None)`` when ``fn`` ran out of memory (the error, which holds the failed
    call's tensors, is dropped before this returns); any other error propagates."""
    try:
        return True, fn()
    except Exception as e:
        if not is_oom(e):
            raise
    return False, None


def run_or_overloaded(fn: Callable[[], R], message: str, *, is_oom: Callable[[BaseException], bool] = is_out_of_memory,
                      on_oom: Callable[[], None] = free_device_memory) -> R:
    """``fn()``, or `OverloadedError(message)` once an out-of-memory failure's memory is freed (no retry)."""
    fitted, result = attempt(fn, is_oom)
    if not fitted:
        on_oom()
        raise OverloadedError(message)
    return result


class Batcher:
    """One shared bounded queue, one worker thread per run function (one per device)."""

    def __init__(self, runs: Sequence[RunFn], config: BatchConfig, *, observer: BatchObserver | None = None,
                 is_oom: Callable[[BaseException], bool] = is_out_of_memory,
                 on_oom: Callable[[], None] = free_device_memory, clock: Callable[[], float] = time.monotonic):
        if not runs:
            raise ValueError("Batcher needs at least one run function")
        self.config, self._runs, self._observer = config, list(runs), observer or NullObserver()
        self._is_oom, self._on_oom, self._clock = is_oom, on_oom, clock
        self._pending: deque[Job] = deque()
        self._reserved = 0  # admitted requests still decoding their inputs: they count towards the queue size
        self._cond = threading.Condition(threading.RLock())
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
            self._observer.queue_depth(0)
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
    def admit(self) -> "Admission":
        """Hold a queue slot (`QueueFullError` or `StoppedError` when there is no room); use it in a `with` block."""
        with self._cond:
            self._check_room()
            self._reserved += 1
        return Admission(self)

    def submit(self, key: Hashable, payload: Any, *, rows: int = 1, timeout_s: float,
               request_id: str | None = None) -> Job:
        """Queue a job; its `future` gets the run function's result for it, or a BatchError."""
        return self._enqueue(key, payload, rows, timeout_s, request_id, admitted=False)

    def check_room(self) -> None:
        """`QueueFullError` (or `StoppedError`) when `admit` would refuse now; takes no slot."""
        with self._cond:
            self._check_room()

    def _check_room(self) -> None:
        if self._stopping:
            raise StoppedError("the service is shutting down")
        taken = len(self._pending) + self._reserved
        if taken >= self.config.queue_size:
            raise QueueFullError(f"the queue is full ({self.config.queue_size} jobs waiting)", self._retry_after(taken))
        bound = self.config.max_queue_wait_s
        wait = self.estimated_wait_s(taken)
        if bound is not None and wait > bound:
            raise QueueFullError(f"the estimated wait ({wait:.1f} s for {taken} jobs ahead) is longer than the "
                                 f"service's bound of {bound:g} s", self._retry_after(taken))

    def _release(self) -> None:
        with self._cond:
            self._reserved -= 1

    def _enqueue(self, key: Hashable, payload: Any, rows: int, timeout_s: float, request_id: str | None, *,
                 admitted: bool) -> Job:
        if rows < 1:
            if admitted:
                self._release()
            raise ValueError("a job has at least one row")
        now = self._clock()
        job = Job(key=key, rows=rows, payload=payload, deadline=now + timeout_s, enqueued_at=now, request_id=request_id)
        with self._cond:
            if admitted:
                self._reserved -= 1
                if self._stopping:
                    raise StoppedError("the service is shutting down")
            else:
                self._check_room()
            self._pending.append(job)
            self._observer.queue_depth(len(self._pending))
            self._cond.notify_all()
        # the callback is given the future, not the job: a job referring to itself through its future's callbacks
        # would be a cycle, and its images (a full-size content, the results) would wait for a full collection
        job.future.add_done_callback(self._forget_if_cancelled)
        return job

    def _forget_if_cancelled(self, future: concurrent.futures.Future) -> None:
        if not future.cancelled():
            return
        with self._cond:
            job = next((j for j in self._pending if j.future is future), None)
            if job is None:
                return  # a worker took it already: `_running` drops it
            self._pending.remove(job)
            self._observer.queue_depth(len(self._pending))
        self._observer.job_dropped("cancelled")

    def estimated_wait_s(self, depth: int) -> float:
        """Seconds until a job behind `depth` others is served (0 until a run has been timed)."""
        batches_ahead = depth / self.config.max_batch_size / len(self._runs) + 1
        return self._batch_seconds * batches_ahead

    def _retry_after(self, depth: int) -> int:
        return max(1, math.ceil(self.estimated_wait_s(depth)))

    # -- worker side -------------------------------------------------------------------------------
    def _worker(self, run: RunFn) -> None:
        lower_priority(self.config.worker_nice)
        while True:
            try:
                if not self._serve_batch(run):
                    return
            except Exception:  # the worker must survive anything; a bug here fails no job silently
                log.exception("batch worker error")

    def _serve_batch(self, run: RunFn) -> bool:
        """Collect one batch and run it; False when stopping (no reference to its jobs outlives the call)."""
        jobs = self._collect()
        if jobs is None:
            return False
        jobs = self._still_due(self._running(jobs), "the request waited past its deadline")
        if jobs:
            self._execute(run, jobs)
        return True

    def _collect(self) -> list[Job] | None:
        """Block until a batch is due; take it off the queue. None when stopping."""
        cfg = self.config
        with self._cond:
            while True:
                if self._stopping:
                    return None
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
                self._observer.queue_depth(len(self._pending))
                return taken

    def _running(self, jobs: list[Job]) -> list[Job]:
        """Drop jobs whose client went away; mark the rest running."""
        running = []
        for job in jobs:
            if job.future.set_running_or_notify_cancel():
                running.append(job)
            else:
                self._observer.job_dropped("cancelled")
                log.info("job dropped: client gone", extra={"request_id": job.request_id})
        return running

    def _execute(self, run: RunFn, jobs: list[Job]) -> None:
        """Run `jobs`; a part that runs out of memory is split in halves, run once `on_oom` has freed the cache."""
        parts = [jobs]
        while parts:
            part = parts.pop()
            if part is not jobs:
                part = self._still_due(part, "the request passed its deadline during retries")
            if not part or self._run_part(run, part):
                continue
            self._on_oom()
            rows = sum(j.rows for j in part)
            if len(part) > 1:
                self._observer.oom_split()
                log.warning("out of memory with %d jobs (%d rows): splitting the batch", len(part), rows)
                mid = len(part) // 2
                parts += [part[mid:], part[:mid]]
                continue
            log.error("out of memory on a single job of %d rows", rows, extra={"request_id": part[0].request_id})
            part[0].future.set_exception(OverloadedError("the request does not fit in device memory now"))

    def _run_part(self, run: RunFn, jobs: list[Job]) -> bool:
        """One run call: True when it answered `jobs` (results or an error), False when it ran out of memory."""
        rows = sum(j.rows for j in jobs)
        t0 = self._clock()
        for job in jobs:
            job.started_at = t0
        try:
            fitted, results = attempt(lambda: run(jobs), self._is_oom)
            if fitted and len(results) != len(jobs):
                raise RuntimeError(f"run function returned {len(results)} results for {len(jobs)} jobs")
        except Exception as e:
            self._observer.batch_done(len(jobs), rows, self._clock() - t0, ok=False)
            log.exception("run failed for a batch of %d jobs", len(jobs),
                          extra={"request_ids": [j.request_id for j in jobs]})
            for job in jobs:
                err = InferenceError(f"inference failed: {type(e).__name__}")
                err.__cause__ = e
                job.future.set_exception(err)
            return True
        t1 = self._clock()
        seconds = t1 - t0
        if not fitted:
            self._observer.batch_done(len(jobs), rows, seconds, ok=False)
            return False
        for job in jobs:
            job.finished_at = t1
        self._batch_seconds = seconds if self._batch_seconds == 0 else 0.8 * self._batch_seconds + 0.2 * seconds
        self._observer.batch_done(len(jobs), rows, seconds, ok=True)
        for job, result in zip(jobs, results):
            job.future.set_result(result)
        return True

    def _still_due(self, jobs: list[Job], message: str) -> list[Job]:
        """The jobs whose deadline has not passed; each of the others fails with `DeadlineExceededError(message)`."""
        now = self._clock()
        for job in jobs:
            if now > job.deadline:
                self._observer.job_dropped("deadline")
                job.future.set_exception(DeadlineExceededError(message))
        return [job for job in jobs if now <= job.deadline]


class Admission:
    """A queue slot held by a request while it decodes its inputs (see `Batcher.admit`)."""

    def __init__(self, batcher: Batcher):
        self._batcher = batcher
        self._held = True

    def submit(self, key: Hashable, payload: Any, *, rows: int = 1, timeout_s: float,
               request_id: str | None = None) -> Job:
        """Queue the job in the held slot (the slot is used up either way)."""
        if not self._held:
            raise RuntimeError("this admission was already used or released")
        self._held = False
        return self._batcher._enqueue(key, payload, rows, timeout_s, request_id, admitted=True)

    def release(self) -> None:
        if self._held:
            self._held = False
            self._batcher._release()

    def __enter__(self) -> "Admission":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
