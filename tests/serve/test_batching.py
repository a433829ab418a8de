"""The batcher with injected run functions: grouping, limits, cancellation, failures, OOM splitting."""
from __future__ import annotations

import math
import os
import threading
import time
import weakref

import pytest
import torch

from serve.engine.batching import (
    BatchConfig,
    Batcher,
    DeadlineExceededError,
    InferenceError,
    OverloadedError,
    QueueFullError,
    StoppedError,
    attempt,
    run_or_overloaded,
)
from serve.http.metrics import ServiceMetrics

T = 10.0  # generous per-job timeout for tests that do not test deadlines


class Recorder:
    """A run function that records each batch (as payload lists) and echoes payloads doubled."""

    def __init__(self, fail=None, delay: float = 0.0):
        self.batches: list[list] = []
        self.fail = fail  # callable(jobs) -> exception to raise or None
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, jobs):
        with self.lock:
            self.batches.append([j.payload for j in jobs])
        if self.delay:
            time.sleep(self.delay)
        if self.fail is not None:
            exc = self.fail(jobs)
            if exc is not None:
                raise exc
        return [j.payload * 2 for j in jobs]


def results(jobs, timeout=10.0):
    return [j.future.result(timeout) for j in jobs]


def sample(metrics: ServiceMetrics, name: str, labels: dict | None = None) -> float:
    return metrics.registry.get_sample_value(name, labels or {}) or 0.0


@pytest.fixture
def metrics():
    return ServiceMetrics()


def make(run, metrics, **cfg) -> Batcher:
    return Batcher([run], BatchConfig(**{"max_batch_size": 8, "max_wait_s": 0.05, "queue_size": 64, **cfg}),
                   observer=metrics, on_oom=lambda: None)


def test_compatible_jobs_share_one_call_and_keys_stay_apart(metrics):
    run = Recorder()
    b = make(run, metrics)
    jobs = [b.submit("a", i, timeout_s=T) for i in range(5)] + [b.submit("b", 10, timeout_s=T)]
    b.start()
    try:
        assert results(jobs) == [0, 2, 4, 6, 8, 20]
    finally:
        b.stop()
    assert run.batches == [[0, 1, 2, 3, 4], [10]]
    assert sample(metrics, "stylevar_batch_size_jobs_sum") == 6
    assert sample(metrics, "stylevar_batch_size_jobs_count") == 2


def test_rows_count_towards_the_batch_size(metrics):
    run = Recorder()
    b = make(run, metrics, max_batch_size=8)
    jobs = [b.submit("k", i, rows=3, timeout_s=T) for i in range(3)]
    big = b.submit("k", 9, rows=12, timeout_s=T)  # larger than a batch: runs alone
    b.start()
    try:
        results(jobs + [big])
    finally:
        b.stop()
    assert run.batches == [[0, 1], [2], [9]]
    assert sample(metrics, "stylevar_batch_size_rows_sum") == 3 + 3 + 3 + 12


def test_full_queue_refuses_with_retry_after(metrics):
    b = make(Recorder(), metrics, queue_size=2)
    b.submit("k", 1, timeout_s=T)
    b.submit("k", 2, timeout_s=T)
    with pytest.raises(QueueFullError) as e:
        b.submit("k", 3, timeout_s=T)
    assert e.value.retry_after_s >= 1
    b.start()
    b.stop()


def test_cancelled_job_is_dropped_before_running(metrics):
    run = Recorder()
    b = make(run, metrics)
    gone = b.submit("k", 1, timeout_s=T)
    kept = b.submit("k", 2, timeout_s=T)
    assert gone.future.cancel()  # what the app does when the client disconnects
    b.start()
    try:
        assert kept.future.result(5) == 4
    finally:
        b.stop()
    assert run.batches == [[2]]
    assert sample(metrics, "stylevar_jobs_dropped_total", {"reason": "cancelled"}) == 1


def test_expired_job_fails_with_deadline_and_never_runs(metrics):
    run = Recorder()
    b = make(run, metrics)
    late = b.submit("k", 1, timeout_s=0.0)
    time.sleep(0.01)
    b.start()
    try:
        with pytest.raises(DeadlineExceededError):
            late.future.result(5)
    finally:
        b.stop()
    assert run.batches == []
    assert sample(metrics, "stylevar_jobs_dropped_total", {"reason": "deadline"}) == 1


def test_a_failing_run_fails_its_batch_and_the_worker_keeps_serving(metrics):
    calls = {"n": 0}

    def fail(jobs):
        calls["n"] += 1
        return RuntimeError("boom") if calls["n"] == 1 else None

    run = Recorder(fail=fail)
    b = make(run, metrics, max_wait_s=0.0)
    b.start()
    try:
        first = b.submit("k", 1, timeout_s=T)
        with pytest.raises(InferenceError) as e:
            first.future.result(5)
        assert isinstance(e.value.__cause__, RuntimeError)
        later = [b.submit("k", i, timeout_s=T) for i in range(3)]
        assert results(later) == [0, 2, 4]
    finally:
        b.stop()
    assert sample(metrics, "stylevar_inference_seconds_count", {"outcome": "error"}) == 1


def test_a_run_returning_the_wrong_count_fails_the_batch(metrics):
    b = make(lambda jobs: [], metrics, max_wait_s=0.0)
    b.start()
    try:
        job = b.submit("k", 1, timeout_s=T)
        with pytest.raises(InferenceError):
            job.future.result(5)
    finally:
        b.stop()


def test_out_of_memory_splits_the_batch_until_it_fits(metrics):
    run = Recorder(fail=lambda jobs: torch.OutOfMemoryError("CUDA out of memory") if len(jobs) > 1 else None)
    b = make(run, metrics)
    jobs = [b.submit("k", i, timeout_s=T) for i in range(4)]
    b.start()
    try:
        assert results(jobs) == [0, 2, 4, 6]
    finally:
        b.stop()
    assert run.batches[0] == [0, 1, 2, 3]
    assert sorted(len(x) for x in run.batches) == [1, 1, 1, 1, 2, 2, 4]
    assert sample(metrics, "stylevar_oom_splits_total") == 3


def test_out_of_memory_on_a_single_job_answers_overloaded_and_recovers(metrics):
    state = {"oom": True}
    run = Recorder(fail=lambda jobs: torch.OutOfMemoryError("CUDA out of memory") if state["oom"] else None)
    b = make(run, metrics)
    jobs = [b.submit("k", i, timeout_s=T) for i in range(2)]
    b.start()
    try:
        for j in jobs:
            with pytest.raises(OverloadedError):
                j.future.result(5)
        state["oom"] = False
        assert b.submit("k", 5, timeout_s=T).future.result(5) == 10
    finally:
        b.stop()


def test_one_worker_per_run_function_share_the_queue(metrics):
    runs = [Recorder(delay=0.05), Recorder(delay=0.05)]
    b = Batcher(runs, BatchConfig(max_batch_size=1, max_wait_s=0.0, queue_size=64), observer=metrics)
    b.start()
    try:
        jobs = [b.submit("k", i, timeout_s=T) for i in range(8)]
        assert results(jobs) == [2 * i for i in range(8)]
    finally:
        b.stop()
    assert all(r.batches for r in runs), "both workers served jobs"
    assert sum(len(r.batches) for r in runs) == 8


def test_stop_fails_waiting_jobs_and_refuses_new_ones(metrics):
    b = make(Recorder(), metrics, max_wait_s=5.0)
    b.start()
    job = b.submit("k", 1, timeout_s=T)
    b.stop()
    with pytest.raises(StoppedError):
        job.future.result(1)
    with pytest.raises(StoppedError):
        b.submit("k", 2, timeout_s=T)


def test_queue_depth_gauge_follows_the_queue(metrics):
    b = make(Recorder(), metrics, max_wait_s=0.0)
    b.submit("k", 1, timeout_s=T)
    b.submit("k", 2, timeout_s=T)
    assert sample(metrics, "stylevar_queue_depth") == 2
    b.start()
    try:
        deadline = time.monotonic() + 5
        while sample(metrics, "stylevar_queue_depth") != 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        b.stop()
    assert sample(metrics, "stylevar_queue_depth") == 0


def test_batcher_needs_a_run_function():
    with pytest.raises(ValueError):
        Batcher([], BatchConfig())


def test_queue_depth_gauge_is_exact_through_cancellations(metrics):
    """A cancelled job leaves the queue (and the gauge) at once, not at the next purge; an idle batcher reads 0."""
    run = Recorder()
    b = make(run, metrics, queue_size=3, max_wait_s=0.0)
    jobs = [b.submit("k", i, timeout_s=T) for i in range(3)]
    assert sample(metrics, "stylevar_queue_depth") == 3
    assert jobs[1].future.cancel()
    assert sample(metrics, "stylevar_queue_depth") == 2 and b.depth == 2
    assert sample(metrics, "stylevar_jobs_dropped_total", {"reason": "cancelled"}) == 1
    more = b.submit("k", 3, timeout_s=T)  # the cancelled job's slot is free
    for job in (jobs[0], jobs[2], more):
        assert job.future.cancel()
    assert sample(metrics, "stylevar_queue_depth") == 0 and b.depth == 0
    with b.admit():  # a request decoding its inputs holds a slot but is not waiting for a worker yet
        assert sample(metrics, "stylevar_queue_depth") == 0
    b.start()
    try:
        assert b.submit("k", 5, timeout_s=T).future.result(5) == 10
        time.sleep(0.05)
        assert sample(metrics, "stylevar_queue_depth") == 0
    finally:
        b.stop()
    assert run.batches == [[5]], "cancelled jobs never run"
    assert sample(metrics, "stylevar_jobs_dropped_total", {"reason": "cancelled"}) == 4


def test_queue_depth_gauge_under_concurrent_submits_and_cancels(metrics):
    run = Recorder(delay=0.001)
    b = make(run, metrics, queue_size=1000, max_wait_s=0.001)
    b.start()
    try:
        def client(i: int) -> None:
            for j in range(40):
                job = b.submit(("k", j % 3), i, timeout_s=T)
                if j % 2:
                    job.future.cancel()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        deadline = time.monotonic() + 10
        while b.depth and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        assert b.depth == 0
        assert sample(metrics, "stylevar_queue_depth") == 0
    finally:
        b.stop()


def test_admission_holds_a_slot_until_submitted_or_released(metrics):
    b = make(Recorder(), metrics, queue_size=2)
    first = b.admit()
    b.submit("k", 1, timeout_s=T)
    with pytest.raises(QueueFullError):  # one waiting job + one request still decoding
        b.admit()
    with pytest.raises(QueueFullError):
        b.submit("k", 2, timeout_s=T)
    first.release()
    first.release()  # idempotent
    with b.admit() as second:
        job = second.submit("k", 3, timeout_s=T)
        with pytest.raises(RuntimeError):
            second.submit("k", 4, timeout_s=T)
    assert b.depth == 2 and sample(metrics, "stylevar_queue_depth") == 2
    with pytest.raises(QueueFullError):
        b.admit()
    job.future.cancel()
    with b.admit():  # an admission given back by leaving the block frees its slot
        pass
    b.admit().release()
    b.stop()
    with pytest.raises(StoppedError):
        b.admit()


def test_admission_bounds_the_estimated_wait_not_only_the_queue_length(metrics):
    """With max_queue_wait_s, a job is refused once the jobs ahead of it would take longer than the
    bound (queue position x the measured run time), with a Retry-After from the same estimate."""
    run = Recorder(delay=0.2)
    b = make(run, metrics, max_batch_size=1, max_wait_s=0.0, max_queue_wait_s=1.0)
    b.start()
    try:
        b.submit("a", 0, timeout_s=T).future.result(5)  # one timed run: about 0.2 s per batch
        assert b.estimated_wait_s(0) == pytest.approx(0.2, abs=0.1)
        admitted, refused = [], None
        for i in range(20):
            try:
                admitted.append(b.submit("a", i, timeout_s=T))
            except QueueFullError as e:
                refused = e
                break
        assert refused is not None and "estimated wait" in str(refused)
        assert 3 <= len(admitted) <= 6  # about 1 s of 0.2 s batches ahead, far below the queue size of 64
        assert 1 <= refused.retry_after_s <= math.ceil(b.estimated_wait_s(len(admitted)))  # the same estimate
        assert results(admitted) == [2 * i for i in range(len(admitted))]
    finally:
        b.stop()


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="per-thread nice is Linux's")
def test_workers_run_at_the_configured_lower_priority(metrics):
    """worker_nice lowers the batch workers' priority (and only theirs), so the event loop stays prompt."""
    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    seen = []

    def run(jobs):
        seen.append(nice())
        return [j.payload for j in jobs]

    b = make(run, metrics, worker_nice=3)
    b.start()
    try:
        assert results([b.submit("a", 1, timeout_s=T)]) == [1]
    finally:
        b.stop()
    assert seen == [min(19, nice() + 3)]


@pytest.mark.parametrize("freeze", [True, False])
def test_the_startup_heap_is_frozen_before_the_service_is_ready(tiny_model_dir, freeze):
    """A full garbage collection over the ~500k objects of startup would hold the GIL for ~0.3 s (the 503 p99
    under overload past 100 ms); with STYLEVAR_GC_FREEZE (the default) they are in the permanent
    generation by the time /readyz says ready, so a collection walks only what requests allocate."""
    import gc

    from fastapi.testclient import TestClient

    from serve.http.app import create_app
    from serve.settings import ServeSettings

    gc.unfreeze()
    app = create_app(ServeSettings(model_dir=tiny_model_dir, device=["cpu"], ui=False, warmup=False, gc_freeze=freeze))
    try:
        with TestClient(app) as client:
            deadline = time.monotonic() + 60
            while client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            frozen = gc.get_freeze_count()
    finally:
        gc.unfreeze()  # the rest of the test process collects as before
    assert (frozen > 10_000) if freeze else frozen == 0, frozen


def test_a_finished_job_is_freed_as_soon_as_its_caller_drops_it(metrics):
    """Neither the worker (waiting for the next batch) nor the job's own future keeps a served job alive: its
    payload and result (a full-size content and its images, in the service) go at once, not at some later
    garbage collection."""
    import gc
    import weakref

    class Image:  # stands for a large payload; weakly referable
        pass

    b = make(lambda jobs: [Image() for _ in jobs], metrics)
    b.start()
    gc.disable()
    try:
        job = b.submit("k", Image(), timeout_s=T)
        payload, result = weakref.ref(job.payload), weakref.ref(job.future.result(10))
        time.sleep(0.1)  # the worker is back waiting for a batch
        del job
        assert payload() is None and result() is None
    finally:
        gc.enable()
        b.stop()


def test_out_of_memory_retry_runs_after_the_failed_call_is_freed(metrics):
    """The failed call's frame holds a real tensor (as a model call holds its KV caches): a weak reference to it
    is dead when the cache is freed and when the halves run, i.e. the error's traceback was dropped first."""
    held: list[weakref.ref] = []
    alive_at: list[tuple[str, bool]] = []

    def run(jobs):
        if held:
            alive_at.append(("retry", held[0]() is not None))
        if len(jobs) > 1:
            activations = torch.ones(256, 256)
            held.append(weakref.ref(activations))
            raise torch.OutOfMemoryError("CUDA out of memory")
        return [j.payload * 2 for j in jobs]

    b = Batcher([run], BatchConfig(max_batch_size=8, max_wait_s=0.05, queue_size=64), observer=metrics,
                on_oom=lambda: alive_at.append(("on_oom", held[0]() is not None)))
    jobs = [b.submit("k", i, timeout_s=T) for i in range(2)]
    b.start()
    try:
        assert results(jobs) == [0, 2]
    finally:
        b.stop()
    assert alive_at == [("on_oom", False), ("retry", False), ("retry", False)]


def oom():
    raise torch.OutOfMemoryError("CUDA out of memory")


def test_attempt_gives_back_out_of_memory_and_raises_the_rest():
    def not_memory():
        raise ValueError("not memory")

    assert attempt(lambda: 3) == (True, 3)
    assert attempt(oom) == (False, None)
    with pytest.raises(ValueError, match="not memory"):
        attempt(not_memory)


def test_run_or_overloaded_frees_then_refuses():
    freed: list[bool] = []
    with pytest.raises(OverloadedError, match="the clip does not fit"):
        run_or_overloaded(oom, "the clip does not fit", on_oom=lambda: freed.append(True))
    assert freed == [True]
    assert run_or_overloaded(lambda: "ok", "-", on_oom=lambda: freed.append(False)) == "ok" and freed == [True]
