"""The server's connections, bounded in number and in time: uvicorn's HTTP protocol with a send timeout and limits.

A client reading less than `PROGRESS_BYTES` of a waiting answer in `send_timeout_s` is cut off; a request still
arriving at shutdown gets 503 `shutting_down`; one over `max_connections` or `max_per_client` (per peer address)
gets 503 `too_many_connections`. `bounded_protocol(policy)` makes the class for `uvicorn.Config(http=...)`.
"""
from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus

from starlette.responses import Response
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from serve.http.drain import shutting_down
from serve.http.errors import error_response
from serve.http.middleware import discard_body

log = logging.getLogger("serve.http.connections")

PROGRESS_BYTES = 16 * 1024  # what a client must read of a waiting answer within the send timeout
REFUSED_BODY_BYTES = 1024 * 1024  # of a refused request's body, read and dropped so closing does not reset the client
RETRY_AFTER_S = 1


@dataclass(frozen=True)
class ConnectionPolicy:
    send_timeout_s: float
    max_connections: int = 0
    max_per_client: int = 0

    @classmethod
    def from_settings(cls, settings) -> ConnectionPolicy:
        return cls(settings.send_timeout_s, settings.max_connections, settings.max_connections_per_client)


class ConnectionCounts:
    """Open connections, in all and by client address."""

    def __init__(self) -> None:
        self.total = 0
        self.by_client: Counter[str] = Counter()

    def over(self, policy: ConnectionPolicy, client: str) -> bool:
        return bool((policy.max_connections and self.total >= policy.max_connections)
                    or (policy.max_per_client and self.by_client[client] >= policy.max_per_client))

    def opened(self, client: str) -> None:
        self.total += 1
        self.by_client[client] += 1

    def closed(self, client: str) -> None:
        self.total -= 1
        self.by_client[client] -= 1
        if self.by_client[client] <= 0:
            del self.by_client[client]


async def too_many_connections(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    await discard_body(receive, REFUSED_BODY_BYTES, stall_s=1.0)
    detail = "too many connections to the service (from this client, or in all); retry shortly"
    response = error_response(503, "too_many_connections", detail,
                              {"Retry-After": str(RETRY_AFTER_S), "Connection": "close"})
    await response(scope, receive, send)


class BoundedConnection:
    """The send timeout and the limits, mixed into uvicorn's HTTP protocol by `bounded_protocol`."""

    policy: ConnectionPolicy
    counts: ConnectionCounts
    on_refused: Callable[[], None] | None = None
    _watch: asyncio.TimerHandle | None = None
    _peer = "unknown"
    _unanswered = False  # bytes of a request arrived that no app call answers yet

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._peer = str(self.client[0]) if self.client else "unknown"  # type: ignore[attr-defined]
        if self.counts.over(self.policy, self._peer):
            self.app = too_many_connections  # what uvicorn runs for each request on this connection
            if self.on_refused is not None:
                self.on_refused()
        self.counts.opened(self._peer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.counts.closed(self._peer)
        self._stop_watch()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]
        cycle = self.cycle  # type: ignore[attr-defined]
        self._unanswered = cycle is None or cycle.response_complete  # else the app has the request

    def shutdown(self) -> None:
        if self._unanswered and not self.transport.is_closing():  # type: ignore[attr-defined]
            self.transport.write(raw_answer(shutting_down(  # type: ignore[attr-defined]
                "the service is shutting down; retry on another replica")))
        super().shutdown()  # type: ignore[misc]

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        self._watch_from(self.transport.get_write_buffer_size())  # type: ignore[attr-defined]

    def resume_writing(self) -> None:
        self._stop_watch()
        super().resume_writing()  # type: ignore[misc]

    def _watch_from(self, waiting: int) -> None:
        self._watch = self.loop.call_later(  # type: ignore[attr-defined]
            self.policy.send_timeout_s, self._check_progress, waiting)

    def _check_progress(self, waiting_before: int) -> None:
        waiting = self.transport.get_write_buffer_size()  # type: ignore[attr-defined]
        if waiting_before - waiting >= PROGRESS_BYTES:
            self._watch_from(waiting)
            return
        log.warning("send timeout: the client read %d bytes of its answer in %g s; disconnected",
                    max(0, waiting_before - waiting), self.policy.send_timeout_s, extra={"client": self._peer})
        self._watch = None
        self.transport.abort()  # type: ignore[attr-defined]

    def _stop_watch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None


def raw_answer(response: Response) -> bytes:
    """A complete response's bytes on the wire (HTTP/1.1), for a connection no app call answers."""
    head = [f"HTTP/1.1 {response.status_code} {HTTPStatus(response.status_code).phrase}".encode("latin-1")]
    head += [name + b": " + value for name, value in response.raw_headers]
    return b"\r\n".join(head) + b"\r\n\r\n" + bytes(response.body)


def bounded_protocol(policy: ConnectionPolicy, on_refused: Callable[[], None] | None = None,
                     base: type[asyncio.Protocol] = AutoHTTPProtocol) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (`base`) with `policy`; `on_refused()` for each connection over a limit."""
    return type(f"Bounded{base.__name__}", (BoundedConnection, base),
                {"policy": policy, "counts": ConnectionCounts(), "on_refused": staticmethod(on_refused)})
