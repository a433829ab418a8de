"""The memory of full-size images, bounded across requests: a process-wide budget of pixels in flight.

A request reserves its pixels (from the files' headers) before decoding and holds them until its answer is sent
(`ReleaseWhenAnswered`), within `ServeSettings.max_pixels_in_flight`. One that does not fit waits in line within
its deadline (passing it when that delays no one); it is refused at once with 503 (`MemoryBusyError`) when the
predicted holds (`HoldTimes`) leave it too little time, and 413 when it needs more than the budget. Event loop only.
"""
from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve.engine.batching import QueueFullError
from serve.http.errors import ClientGone
from stylevar.processing.images import ImageTooLargeError
from stylevar.utils.heap import glibc_function

MARGIN_S = 0.5  # a request must expect to be answered this long before its deadline to be admitted
SAFETY = 1.2  # ... and its measured hold time counts this much more: holds vary with what runs beside them
POLL_S = 0.25  # how often a waiting request checks that its client is still there
DECAY = 0.8  # weight of the past in the measured hold times, at each release
MIN_HOLDS = 3  # measured holds before predictions are trusted
CLASS_RATIO = 4.0  # holds of requests within this factor of pixels of each other share one size class
TRIM_PIXELS = 4_000_000  # a request that held this many pixels gives the freed heap back to the system
SCOPE_KEY = "pixels_reserved"  # where a request's reservation waits for its answer to be sent (scope["state"])


class MemoryBusyError(QueueFullError):
    """The pixels a request needs cannot be had in time; try again after `retry_after_s`."""

    code = "memory_busy"


class PixelObserver(Protocol):
    def pixels(self, held: int, waiting: int) -> None: ...


@dataclass(eq=False)
class Reservation:
    """Pixels held by one request; `release` (once, idempotent) gives them back."""

    pixels: int
    budget: MemoryBudget | None = None
    acquired_at: float = 0.0
    released: bool = False
    passed: bool = False  # granted while requests waited in line ahead of it (see `MemoryBudget`)
    reached_model: bool = False  # its model work succeeded (see `model_done`) ...
    answered_at: float | None = None  # ... and its whole answer was handed to the server: its hold is measured

    def model_done(self, ok: bool) -> None:
        """Only holds whose model work succeeded are measured (called on a worker thread)."""
        self.reached_model = ok

    def answer_handed_over(self) -> None:
        """The measured hold ends here (a slow reader does not count; an answer never handed over is not measured)."""
        if self.budget is not None and self.answered_at is None:
            self.answered_at = self.budget._clock()

    def release(self) -> None:
        if not self.released:
            self.released = True
            if self.budget is not None:
                self.budget._release(self)


class HoldTimes:
    """How long a request holds its pixels, from reservation to answer sent: decayed means per size class (a factor
    `CLASS_RATIO`), predicted by the line through the nearest classes, never past the largest request measured."""

    def __init__(self) -> None:
        self._classes: dict[int, tuple[float, float, float]] = {}  # class -> decayed sums: 1, pixels, seconds
        self.measured = 0
        self.largest = 0  # pixels of the largest request measured: no prediction past it

    def observe(self, pixels: int, seconds: float) -> None:
        c = round(math.log(max(pixels, 1), CLASS_RATIO))
        w, p, t = self._classes.get(c, (0.0, 0.0, 0.0))
        self._classes[c] = (DECAY * w + 1, DECAY * p + pixels, DECAY * t + seconds)
        self.measured += 1
        self.largest = max(self.largest, pixels)

    def predict(self, pixels: int) -> float | None:
        """The expected hold of `pixels`; None when unsure (too few holds measured, or larger than any measured)."""
        if self.measured < MIN_HOLDS or pixels > self.largest:
            return None
        points = sorted((p / w, t / w) for w, p, t in self._classes.values())  # (pixels, seconds) per class
        if len(points) == 1:  # one size only: all of it per pixel
            (p0, t0), = points
            return t0 * pixels / p0 if p0 else t0
        i = min(max(1, sum(p <= pixels for p, _ in points)), len(points) - 1)
        (p0, t0), (p1, t1) = points[i - 1], points[i]
        per_pixel = max(0.0, (t1 - t0) / (p1 - p0))
        return max(0.0, t0 + per_pixel * (pixels - p0))


@dataclass(eq=False)
class _Waiter:
    pixels: int
    granted: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class MemoryBudget:
    """At most `limit` pixels held at once by all requests (0: no bound). Not thread-safe: event loop only."""

    def __init__(self, limit: int, observer: PixelObserver | None = None, clock: Callable[[], float] = time.monotonic):
        self.limit, self._observer, self._clock = limit, observer, clock
        self.held = 0
        self.passing = 0  # of `held`: the pixels of requests that passed the line
        self._holders: set[Reservation] = set()
        self._line: deque[_Waiter] = deque()
        self.holds = HoldTimes()

    @property
    def waiting(self) -> int:
        return sum(w.pixels for w in self._line)

    def hold_s(self, pixels: int) -> float:
        """The predicted time `pixels` stay held (from their reservation to the answer sent); 0 when unsure."""
        return self.holds.predict(pixels) or 0.0

    def check(self, timeout_s: float) -> None:
        """`MemoryBusyError` when even the smallest request arriving now could not be served in time."""
        if self.limit and self._line and not self._may_pass(1, len(self._line)):
            self._refuse_if_late(1, self._clock() + timeout_s)

    async def reserve(self, pixels: int, deadline: float,
                      disconnected: Callable[[], Awaitable[bool]] | None = None) -> Reservation:
        """Hold `pixels` for a request due at `deadline` (`time.monotonic()`), waiting while there is time;
        raises `MemoryBusyError`, `ImageTooLargeError` (over the whole budget) or `ClientGone`."""
        if not self.limit:
            return Reservation(pixels)
        if pixels > self.limit:
            raise ImageTooLargeError(
                f"the request needs {pixels / 1e6:.1f} megapixels in memory (its decoded images and results), "
                f"more than the service's budget of {self.limit / 1e6:.1f} (STYLEVAR_MAX_PIXELS_IN_FLIGHT): send a "
                "smaller content image or fewer samples")
        if self._may_pass(pixels, len(self._line)):
            return self._grant(pixels, passed=bool(self._line))
        self._refuse_if_late(pixels, deadline)
        waiter = _Waiter(pixels)
        self._line.append(waiter)
        self._report()
        try:
            await self._wait(waiter, deadline, disconnected)
        except BaseException:
            self._leave(waiter)
            raise
        return waiter.granted.result()

    def _may_pass(self, pixels: int, ahead: int) -> bool:
        largest = max((w.pixels for w in itertools.islice(self._line, ahead)), default=None)
        return self._fits(pixels, largest, self.held, self.passing)

    def _fits(self, pixels: int, largest_ahead: int | None, held: int, passing: int) -> bool:
        """Whether `pixels` fit beside `held` and, with the `passing` pixels, leave room for the largest waiter."""
        return held + pixels <= self.limit and (largest_ahead is None or passing + pixels + largest_ahead <= self.limit)

    def _refuse_if_late(self, pixels: int, deadline: float) -> None:
        now = self._clock()
        start = self._predicted_start(pixels, now)
        if start is not None and start > self._latest_start(pixels, deadline):
            raise MemoryBusyError(
                f"the service's memory for full-size images is taken: {self.held / 1e6:.1f} megapixels held and "
                f"{self.waiting / 1e6:.1f} waiting of {self.limit / 1e6:.1f}; this request would not be answered "
                "before its deadline", max(1, math.ceil(start - now)))

    def _latest_start(self, pixels: int, deadline: float) -> float:
        return deadline - SAFETY * self.hold_s(pixels) - MARGIN_S

    def _predicted_start(self, pixels: int, now: float) -> float | None:
        """When a request of `pixels` joining now would get them (its turn or passing); None when unsure."""
        sizes = [r.pixels for r in self._holders] + [w.pixels for w in self._line] + [pixels]
        if any(self.holds.predict(p) is None for p in sizes):
            return None
        releases = sorted((max(now, r.acquired_at + self.hold_s(r.pixels)), r.pixels, r.passed) for r in self._holders)
        return min(self._turn(pixels, now, releases), self._passing_at(pixels, now, releases))

    def _turn(self, pixels: int, now: float, releases: list[tuple[float, int, bool]]) -> float:
        heap = [(at, px) for at, px, _ in releases]
        heapq.heapify(heap)
        free, t = self.limit - self.held, now
        for need in [w.pixels for w in self._line] + [pixels]:
            while free < need and heap:
                at, px = heapq.heappop(heap)
                t, free = max(t, at), free + px
            free -= need
            heapq.heappush(heap, (t + self.hold_s(need), need))
        return t

    def _passing_at(self, pixels: int, now: float, releases: list[tuple[float, int, bool]]) -> float:
        largest = max((w.pixels for w in self._line), default=None)
        held, passing = self.held, self.passing
        for at, px, passed in [(now, 0, False), *releases]:
            held, passing = held - px, passing - (px if passed else 0)
            if self._fits(pixels, largest, held, passing):
                return at
        return math.inf

    async def _wait(self, waiter: _Waiter, deadline: float, disconnected: Callable[[], Awaitable[bool]] | None) -> None:
        while True:
            left = self._latest_start(waiter.pixels, deadline) - self._clock()
            if waiter.granted.done() or left <= 0:
                break
            await asyncio.wait({waiter.granted}, timeout=min(POLL_S, left))
            if not waiter.granted.done() and disconnected is not None and await disconnected():
                raise ClientGone()
        if left <= 0:
            raise MemoryBusyError(
                "the service's memory for full-size images did not free up in time for this request to be answered "
                "before its deadline", max(1, math.ceil(self.hold_s(waiter.pixels))))

    def _grant(self, pixels: int, passed: bool = False) -> Reservation:
        reservation = Reservation(pixels, self, self._clock(), passed=passed)
        self.held += pixels
        self.passing += pixels if passed else 0
        self._holders.add(reservation)
        self._report()
        return reservation

    def _leave(self, waiter: _Waiter) -> None:
        if waiter.granted.done():
            if not waiter.granted.cancelled():
                waiter.granted.result().release()
            return
        waiter.granted.cancel()
        self._line.remove(waiter)
        self._serve_line()  # the head may have been what held the others back

    def _release(self, reservation: Reservation) -> None:
        self._holders.discard(reservation)
        self.held -= reservation.pixels
        self.passing -= reservation.pixels if reservation.passed else 0
        if reservation.reached_model and reservation.answered_at is not None:
            self.holds.observe(reservation.pixels, reservation.answered_at - reservation.acquired_at)
        self._serve_line()

    def _serve_line(self) -> None:
        while self._line and self.held + self._line[0].pixels <= self.limit:
            waiter = self._line.popleft()
            waiter.granted.set_result(self._grant(waiter.pixels))
        i, largest = 1, self._line[0].pixels if self._line else 0  # the largest waiter ahead of the i-th
        while i < len(self._line):
            waiter = self._line[i]
            if self._fits(waiter.pixels, largest, self.held, self.passing):
                del self._line[i]
                waiter.granted.set_result(self._grant(waiter.pixels, passed=True))
            else:
                largest, i = max(largest, waiter.pixels), i + 1
        self._report()

    def _report(self) -> None:
        if self._observer is not None:
            self._observer.pixels(self.held, self.waiting)


class HeapTrimmer:
    """Gives the heap large images freed back to the system (glibc's `malloc_trim`, on a thread); else a no-op."""

    def __init__(self) -> None:
        self._wanted = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._trim = glibc_function("malloc_trim")

    def request(self) -> None:
        if self._trim is None:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="stylevar-heap-trim", daemon=True)
                self._thread.start()
        self._wanted.set()

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            self._trim(0)


HEAP_TRIMMER = HeapTrimmer()


def hold_until_answered(scope: Scope, reservation: Reservation) -> None:
    scope.setdefault("state", {})[SCOPE_KEY] = reservation


async def send_flushed(send: Send, handed_over: Callable[[], None], message: Message) -> None:
    """`send`, but the body's last byte goes alone: flow control holds it until the client has read the rest, so
    the pixels stay reserved while the answer waits in the buffer. `handed_over()` is called before it."""
    body = message.get("body", b"")
    if message["type"] != "http.response.body" or message.get("more_body", False):
        await send(message)
        return
    if len(body) >= 2:
        await send({"type": "http.response.body", "body": body[:-1], "more_body": True})
        message = {"type": "http.response.body", "body": body[-1:], "more_body": False}
    handed_over()
    await send(message)


class ReleaseWhenAnswered:
    """Release the pixels a request to `paths` reserved once its answer is sent, or it fails or is abandoned."""

    def __init__(self, app: ASGIApp, paths: tuple[str, ...]):
        self.app, self.paths = app, paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in self.paths:
            await self.app(scope, receive, send)
            return
        def handed_over() -> None:
            reservation = scope.get("state", {}).get(SCOPE_KEY)
            if reservation is not None:
                reservation.answer_handed_over()

        try:
            await self.app(scope, receive, functools.partial(send_flushed, send, handed_over))
        finally:
            reservation = scope.get("state", {}).pop(SCOPE_KEY, None)
            if reservation is not None:
                reservation.release()
                if reservation.pixels >= TRIM_PIXELS:
                    HEAP_TRIMMER.request()
