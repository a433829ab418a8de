"""Waiting for a queued job on the event loop: one helper for `/stylize` and `/stylize/stream`.

A job no longer followed before its end is dropped (a worker that has not taken it yet never will).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from starlette.requests import Request

from serve.engine.batching import BatchError, Job
from serve.http.errors import ClientGone, ServiceError, from_coded_error

POLL_S = 0.25  # how often a waiting request checks its deadline and for a client disconnect
P = TypeVar("P")


async def follow_job(job: Job, *, previews: asyncio.Queue[P] | None = None,
                     request: Request | None = None) -> AsyncIterator[P]:
    """Until `job` is done: the items put in `previews` (if given), in order; 504 `ServiceError` past the job's
    deadline, `ClientGone` when `request`'s client disconnects. The result is then `job_result(job)`."""
    afut = asyncio.wrap_future(job.future)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, job.deadline - time.monotonic())
    try:
        while not afut.done():
            left = deadline - loop.time()
            if left <= 0:
                raise ServiceError(504, "deadline_exceeded", "the request took longer than the service's deadline")
            getter = asyncio.ensure_future(previews.get()) if previews is not None else None
            done, _ = await asyncio.wait({afut} if getter is None else {afut, getter}, timeout=min(POLL_S, left),
                                         return_when=asyncio.FIRST_COMPLETED)
            if getter is not None:
                if getter in done:
                    yield getter.result()
                else:
                    getter.cancel()
            elif not done and request is not None and await request.is_disconnected():
                raise ClientGone()
        while previews is not None and not previews.empty():
            yield previews.get_nowait()
    finally:
        if not afut.done():
            afut.cancel()  # also cancels the job if a worker has not taken it yet


def job_result(job: Job) -> Any:
    """The result of a finished job; a batch error as the `ServiceError` to answer."""
    try:
        return job.future.result()
    except BatchError as e:
        raise from_coded_error(e) from e


async def wait_for_job(job: Job, request: Request) -> Any:
    """The job's result; drops the job when the client goes away or the deadline passes."""
    async for _ in follow_job(job, request=request):
        pass
    return job_result(job)
