"""Graceful drain: on SIGTERM or SIGINT stop taking work, finish what is in flight, then exit.

At the first signal `/readyz` and new requests get 503 `shutting_down` (`Retry-After: 1`, `Connection: close`);
requests in flight go on for at most `STYLEVAR_DRAIN_TIMEOUT_S`, then uvicorn's shutdown (at most `CLOSE_GRACE_S`;
a request it cancels gets 503 too). Probes and `/metrics` (`always_open`) stay answered; `untracked_prefixes` (the
UI) are refused but not waited for. A second signal ends the drain; a third SIGINT skips the shutdown.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from collections.abc import Callable, Collection, Sequence
from types import FrameType

import uvicorn
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve.http.errors import error_response
from serve.http.middleware import discard_body

log = logging.getLogger("serve.http.drain")

CLOSE_GRACE_S = 1.0  # what uvicorn may wait, after the drain, for connections the drain does not count


class Drain:
    """The drain of one service: when it began, what is in flight, what it refused. Event loop only."""

    def __init__(self, timeout_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self.started_at: float | None = None
        self.in_flight = 0  # counted requests being served now
        self.in_flight_at_start = 0
        self.completed = 0  # counted requests that ended during the drain with their own answer
        self.cut = 0  # counted requests answered 503 because the shutdown cancelled them
        self.refused = 0  # requests refused during the drain

    @property
    def draining(self) -> bool:
        return self.started_at is not None

    def begin(self) -> None:
        if self.started_at is None:
            self.started_at = self._clock()
            self.in_flight_at_start = self.in_flight

    def elapsed_s(self) -> float:
        return 0.0 if self.started_at is None else self._clock() - self.started_at

    def time_left_s(self) -> float:
        return max(0.0, self.timeout_s - self.elapsed_s())

    def done(self) -> bool:
        return self.draining and (self.in_flight == 0 or self.time_left_s() == 0.0)

    def close_budget_s(self) -> float:
        """uvicorn's graceful shutdown timeout once the drain is over (the whole timeout without a drain)."""
        return min(self.time_left_s(), CLOSE_GRACE_S) if self.draining else self.timeout_s

    def summary(self) -> dict[str, float | int]:
        return {"drain_s": round(self.elapsed_s(), 3), "in_flight_at_signal": self.in_flight_at_start,
                "completed": self.completed, "cut": self.cut, "refused": self.refused,
                "still_in_flight": self.in_flight}


class DrainMiddleware:
    """Counts requests in flight; while draining, refuses new ones and closes each connection after its answer."""

    def __init__(self, app: ASGIApp, drain: Drain, always_open: Collection[str],
                 untracked_prefixes: Sequence[str] = (), max_discard_bytes: int = 20 * 1024 * 1024) -> None:
        self.app, self.drain = app, drain
        self.always_open = frozenset(always_open)
        self.untracked_prefixes = tuple(untracked_prefixes)
        self.max_discard_bytes = max_discard_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        drain = self.drain
        if drain.draining and path not in self.always_open:
            drain.refused += 1
            await discard_body(receive, self.max_discard_bytes)
            await shutting_down("the service is shutting down; retry on another replica")(scope, receive, send)
            return
        counted = path not in self.always_open and not path.startswith(self.untracked_prefixes)
        started = False

        async def send_closing(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if drain.draining:
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        if counted:
            drain.in_flight += 1
        try:
            await self.app(scope, receive, send_closing)
            if counted and drain.draining:
                drain.completed += 1
        except asyncio.CancelledError:
            if started or not drain.draining:
                raise
            drain.cut += counted  # the shutdown gave up on this request: answer it (the cancellation ends here)
            await shutting_down("the service stopped before this request finished")(scope, receive, send)
        finally:
            if counted:
                drain.in_flight -= 1


def shutting_down(detail: str) -> Response:
    return error_response(503, "shutting_down", detail, {"Retry-After": "1", "Connection": "close"})


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain between the first signal and its shutdown; `on_drain()` when it begins,
    `on_started()` once its port listens."""

    def __init__(self, config: uvicorn.Config, drain: Drain, on_drain: Callable[[], None] | None = None,
                 on_started: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.drain = drain
        self._on_drain, self._on_started = on_drain, on_started
        self._signal: int | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self._on_started is not None:  # the port listens
            self._on_started()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Only sets flags (the tick acts on them); unlike uvicorn's, signals are not re-raised: exit code 0."""
        if self._signal is None:
            self._signal = sig
        elif self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self._signal is not None and not self.drain.draining:
            self.drain.begin()
            if self._on_drain is not None:
                self._on_drain()
            log.info("draining", extra={"signal": signal.Signals(self._signal).name,
                                        "in_flight": self.drain.in_flight, "timeout_s": self.drain.timeout_s})
        if self.drain.done():
            return True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.config.timeout_graceful_shutdown = self.drain.close_budget_s()  # type: ignore[assignment]
        await super().shutdown(sockets)
        if self.drain.draining:
            log.info("drained", extra=self.drain.summary())
