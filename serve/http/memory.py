"""The memory of full-size images, bounded across requests: a process-wide budget of pixels in flight.

A stylize request's large buffers all grow with pixels: its decoded content (up to `max_output_side` a side), its
style images and masks, each result (the drawing upsampled to the content's size) and its encoding. Before
decoding anything, a request reserves its pixels (`request_pixels` in `serve.http.routes.stylize` counts them from
the files' headers) and holds them until its answer has been sent (`ReleaseWhenAnswered`); the pixels held by all
requests together never exceed `ServeSettings.max_pixels_in_flight`.

A request that does not fit waits its turn (first come, first served), within its deadline, but a request may pass
the line when its pixels cannot delay anyone waiting: the pixels held by requests that passed, its own included,
leave room for the largest waiter ahead of it, so each waiter still gets its pixels once the requests granted before
it have given theirs back (a 256 px request is not held up by a 36-megapixel one waiting for memory). A request is
refused at once (`MemoryBusyError`, 503 with `Retry-After`) when the requests holding and waiting ahead of it would,
at their predicted hold times (`HoldTimes`: per size class of request, a fixed cost plus a cost per pixel between
the classes measured, learned only from requests that reached the model and whose answers were handed over whole),
leave it too little time to be served, and it stops waiting (the same 503) when the last moment to start passes.
Where the prediction is unsure (too few measured holds, or a request larger than any measured), a request is never
refused at once: it waits within its deadline. A hold is measured from the reservation to the answer handed to the
server (the client's reading is its own). A request needing more pixels than the whole budget is refused with 413
(`image_too_large`): it could never be served within the bound. All of it runs on the event loop.
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
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
        """The request's model work ended (on a worker thread): when it succeeded, the hold is a measure of what
        such a request costs; one refused, cut at its deadline or failed says nothing of that."""
        self.reached_model = ok

    def answer_handed_over(self) -> None:
        """The whole answer is with the server: the measured hold ends here, so that a client that reads slowly does
        not teach the budget that such requests take long. An answer never handed over whole (a stream or a result
        whose client did not read it until the send timeout cut it, a client gone) is not measured at all."""
        if self.budget is not None and self.answered_at is None:
            self.answered_at = self.budget._clock()

    def release(self) -> None:
        if not self.released:
            self.released = True
            if self.budget is not None:
                self.budget._release(self)


class HoldTimes:
    """How long a request holds its pixels, from its reservation to its answer sent. Each size class of requests
    (pixels within a factor `CLASS_RATIO`) keeps the decayed means of its measured pixels and seconds, each past hold
    weighing `DECAY` less at each new one of its class; a prediction is the line through the nearest measured classes
    below and above (a fixed cost plus a cost per pixel), extended up to the largest request measured along the two
    largest classes, never past it: what a larger request holds is not known (a line through 256 px requests and a
    4-sample stream of 13 MP, measured while other work ran, predicted a 36 MP request's hold long enough to refuse
    a burst of them at once). Classes decay on their own: a stream of small requests does not wash out what the
    last large ones took, and the fixed cost of small requests is not taken for the cost of large ones (a single line
    fitted over all holds was)."""

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

    def __init__(self, limit: int, observer: PixelObserver | None = None,
                 clock: Callable[[], float] = time.monotonic):
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
        """`MemoryBusyError` when even the smallest request, arriving now, could neither pass the line nor start
        before its deadline at the end of it: what can be said before its body is read."""
        if self.limit and self._line and not self._may_pass(1, len(self._line)):
            self._refuse_if_late(1, self._clock() + timeout_s)

    async def reserve(self, pixels: int, deadline: float,
                      disconnected: Callable[[], Awaitable[bool]] | None = None) -> Reservation:
        """Hold `pixels` for a request whose answer is due at `deadline` (`time.monotonic()`), waiting for them
        while there is time; `MemoryBusyError` when there is not, `ImageTooLargeError` when they exceed the
        whole budget, `ClientGone` when `disconnected()` says the client left while waiting."""
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
        """Whether a request of `pixels` behind the first `ahead` waiters may have them now."""
        largest = max((w.pixels for w in itertools.islice(self._line, ahead)), default=None)
        return self._fits(pixels, largest, self.held, self.passing)

    def _fits(self, pixels: int, largest_ahead: int | None, held: int, passing: int) -> bool:
        """Whether `pixels` fit beside `held`, and, with the `passing` pixels of the requests that passed, leave room
        for the largest waiter ahead (None: nobody ahead, the request only needs them to fit)."""
        return held + pixels <= self.limit and (largest_ahead is None or passing + pixels + largest_ahead <= self.limit)

    def _refuse_if_late(self, pixels: int, deadline: float) -> None:
        """`MemoryBusyError` when the line ahead of a request of `pixels` is predicted to hold it past the latest
        moment it may start to be answered by `deadline`."""
        now = self._clock()
        start = self._predicted_start(pixels, now)
        if start is not None and start > self._latest_start(pixels, deadline):
            raise MemoryBusyError(
                f"the service's memory for full-size images is taken: {self.held / 1e6:.1f} megapixels held and "
                f"{self.waiting / 1e6:.1f} waiting of {self.limit / 1e6:.1f}; this request would not be answered "
                "before its deadline", max(1, math.ceil(start - now)))

    def _latest_start(self, pixels: int, deadline: float) -> float:
        """The last moment a request of `pixels` may get them and still be answered by `deadline`."""
        return deadline - SAFETY * self.hold_s(pixels) - MARGIN_S

    def _predicted_start(self, pixels: int, now: float) -> float | None:
        """When a request of `pixels` joining the line now would get them, if every request holding or waiting
        ahead holds its pixels for its predicted time: the sooner of its turn (first come, first served) and the
        moment the holders' releases let it pass; None when a prediction is unsure."""
        sizes = [r.pixels for r in self._holders] + [w.pixels for w in self._line] + [pixels]
        if any(self.holds.predict(p) is None for p in sizes):
            return None
        releases = sorted((max(now, r.acquired_at + self.hold_s(r.pixels)), r.pixels, r.passed)
                          for r in self._holders)
        return min(self._turn(pixels, now, releases), self._passing_at(pixels, now, releases))

    def _turn(self, pixels: int, now: float, releases: list[tuple[float, int, bool]]) -> float:
        """When the line ahead, served in order at its predicted holds, leaves a request of `pixels` its turn."""
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
        """When the holders' releases (in their predicted order; the waiters' own grants left out) let a request
        of `pixels` pass the whole line; infinity when they never do."""
        largest = max((w.pixels for w in self._line), default=None)
        held, passing = self.held, self.passing
        for at, px, passed in [(now, 0, False), *releases]:
            held, passing = held - px, passing - (px if passed else 0)
            if self._fits(pixels, largest, held, passing):
                return at
        return math.inf

    async def _wait(self, waiter: _Waiter, deadline: float,
                    disconnected: Callable[[], Awaitable[bool]] | None) -> None:
        """Until `waiter` has its pixels. The last moment to start follows the measured hold time, which the
        requests ahead may change meanwhile; pixels granted after that moment go back at once."""
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
        """A waiter that stopped waiting: out of the line, or its pixels back if they were granted meanwhile."""
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
        """The head of the line while it fits, then the waiters behind it that may pass the rest."""
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
    """Gives the heap memory that large images freed back to the system (glibc's `malloc_trim`), on a thread of its
    own. Freed blocks otherwise stay resident in the allocator's per-thread arenas (measured: about 300 MB more after
    each 36-megapixel request on the 2-core machine, until the next one happened to reuse them). A no-op where
    the C library has no `malloc_trim` (musl, macOS). One per process: the heap is the process's."""

    def __init__(self) -> None:
        self._wanted = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._trim = _malloc_trim()

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


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


HEAP_TRIMMER = HeapTrimmer()


def hold_until_answered(scope: Scope, reservation: Reservation) -> None:
    """Keep `reservation` until the request's answer has been sent (`ReleaseWhenAnswered` releases it)."""
    scope.setdefault("state", {})[SCOPE_KEY] = reservation


async def send_flushed(send: Send, handed_over: Callable[[], None], message: Message) -> None:
    """`send`, but the last part of an answer's body goes as two messages, its last byte alone: the server's
    flow control holds the second until the client has read the rest (uvicorn waits for its write buffer to
    drain before writing the next part), so the request keeps its pixels while its answer waits in the buffer,
    and the send timeout (`serve.http.connections`) bounds that wait. `handed_over()` is called before the
    last part: the answer is with the server then."""
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
    """Release the pixels a request to `paths` reserved once its answer is sent (read by the client but for the
    socket's buffers), or the request fails or is abandoned: a response is sent after its route returns, and
    the image it carries is in memory until then."""

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
