"""Who may call the service: API keys compared in constant time, and a per-client limit on failed attempts.

A client is its peer address as the ASGI server reports it. Only wrong presented credentials count as failures.
"""
from __future__ import annotations

import hashlib
import hmac
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve.http.errors import ServiceError, error_response


class KeyRing:
    """The service's API keys. `matches` compares against every key, in constant time for each."""

    def __init__(self, keys: Sequence[str]):
        self._keys = [k.encode() for k in keys]

    def __bool__(self) -> bool:
        return bool(self._keys)

    def scope_of(self, given: str | None) -> str:
        """A digest of the key scoping keys' shared state (the condition cache); "" when keys are off or unset."""
        if not self._keys or not given:
            return ""
        return hashlib.blake2b(given.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()

    def matches(self, given: str) -> bool:
        candidate = given.encode("utf-8", "surrogateescape")
        found = False
        for key in self._keys:  # no early exit: the time does not tell which key matched
            found |= hmac.compare_digest(candidate, key)
        return found


class FailureLimiter:
    """Failed attempts per client in a sliding window of `window_s` seconds: `max_failures` (0: off) refuse the
    client until the oldest leaves the window. At most `max_clients` clients are tracked (oldest dropped)."""

    def __init__(self, max_failures: int, window_s: float, *, max_clients: int = 10_000,
                 clock: Callable[[], float] = time.monotonic):
        self.max_failures, self.window_s, self.max_clients = max_failures, window_s, max_clients
        self._clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def retry_after(self, client: str) -> int | None:
        """Whole seconds until `client` may try again, or None when it may try now."""
        if self.max_failures <= 0:
            return None
        with self._lock:
            times = self._recent(client)
            if times is None or len(times) < self.max_failures:
                return None
            return max(1, math.ceil(times[0] + self.window_s - self._clock()))

    def failed(self, client: str) -> None:
        if self.max_failures <= 0:
            return
        with self._lock:
            times = self._recent(client)
            if times is None:
                times = self._failures[client] = deque()
                while len(self._failures) > self.max_clients:
                    self._failures.popitem(last=False)
            times.append(self._clock())
            self._failures.move_to_end(client)
            while len(times) > self.max_failures:
                times.popleft()

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._failures.pop(client, None)

    def _recent(self, client: str) -> deque[float] | None:
        """The client's failures inside the window (older ones dropped); called with the lock held."""
        times = self._failures.get(client)
        if times is None:
            return None
        horizon = self._clock() - self.window_s
        while times and times[0] <= horizon:
            times.popleft()
        if not times:
            del self._failures[client]
            return None
        return times


def client_of(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def too_many_attempts(retry_after_s: int) -> ServiceError:
    return ServiceError(429, "too_many_attempts", "too many failed authentication attempts from this client: try "
                        f"again in {retry_after_s} s", {"Retry-After": str(retry_after_s)})


class LoginAttemptLimit:
    """A FailureLimiter over the mounted UI's form logins: 429 while over the limit; a 400/401/403 is a failure."""

    def __init__(self, app: ASGIApp, limiter: FailureLimiter, paths: Sequence[str]):
        self.app, self.limiter = app, limiter
        self.paths = {p.rstrip("/") for p in paths}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope.get("method") != "POST"
                or str(scope.get("path", "")).rstrip("/") not in self.paths):
            await self.app(scope, receive, send)
            return
        client = client_of(scope)
        wait = self.limiter.retry_after(client)
        if wait is not None:
            e = too_many_attempts(wait)
            await error_response(e.status, e.code, e.detail, e.headers)(scope, receive, send)
            return
        status = 0

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.app(scope, receive, watch)
        if status in (400, 401, 403):
            self.limiter.failed(client)
        elif 200 <= status < 300:
            self.limiter.succeeded(client)
