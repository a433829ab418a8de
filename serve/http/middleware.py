"""The request envelope (request id, access log, HTTP metrics, a JSON 500) and the checks made before a body is read.

Plain ASGI middleware (not `BaseHTTPMiddleware`): streamed responses and client disconnects pass through untouched.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve.http.errors import UPLOAD_LIMIT_KEY, ServiceError, error_response, upload_too_large
from serve.http.logs import new_request_id, request_id_var
from serve.http.metrics import ServiceMetrics

log = logging.getLogger("serve.http.access")
REQUEST_ID_HEADER = "X-Request-ID"


def route_label(scope: Scope) -> str:
    """The matched route's path template (bounded label values), or 'unmatched'."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) and path else "unmatched"


class RequestMiddleware:
    def __init__(self, app: ASGIApp, metrics: ServiceMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        offered = None
        for name, value in scope.get("headers", []):
            if name == b"x-request-id":
                offered = value.decode("latin-1")
        rid = new_request_id(offered)
        token = request_id_var.set(rid)
        scope.setdefault("state", {})["request_id"] = rid
        scope["state"]["arrived"] = time.monotonic()  # the request deadline counts from here (serve.http.routes)
        t0 = time.perf_counter()
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = rid
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("unhandled error")
            if status == 0:  # nothing sent yet: answer in the API's error shape (with the request id)
                await error_response(500, "internal", "internal server error")(scope, receive, send_with_id)
            else:
                raise
        finally:
            seconds = time.perf_counter() - t0
            route = route_label(scope)
            method = scope.get("method", "")
            self.metrics.observe_request(route, method, status or 499, seconds)
            log.info(
                "request",
                extra={"method": method, "path": scope.get("path", ""), "route": route,
                       "status": status or 499, "duration_ms": round(seconds * 1000, 2)},
            )
            request_id_var.reset(token)


async def discard_body(receive: Receive, limit: int, stall_s: float | None = None) -> None:
    """Read and drop up to `limit` bytes of the body so closing does not reset it (`stall_s`: idle limit)."""
    seen = 0
    while seen <= limit:
        try:
            message = await asyncio.wait_for(receive(), stall_s)
        except asyncio.TimeoutError:
            return
        if message["type"] != "http.request":
            return
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


class BeforeBody:
    """Refuse a request to `paths` before its body is parsed when `check(scope)` raises a ServiceError (its JSON
    answer, `Connection: close`), after dropping up to ``discard_bytes`` of the body (`discard_body`)."""

    def __init__(self, app: ASGIApp, check: Callable[[Scope], None], paths: tuple[str, ...], discard_bytes: int = 0,
                 stall_s: float | None = None):
        self.app, self.check, self.paths = app, check, paths
        self.discard_bytes, self.stall_s = discard_bytes, stall_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") in self.paths:
            try:
                self.check(scope)
            except ServiceError as e:
                if self.discard_bytes:
                    await discard_body(receive, self.discard_bytes, self.stall_s)
                headers = {**e.headers, "Connection": "close"}
                await error_response(e.status, e.code, e.detail, headers)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def bearer_token(scope: Scope) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header, else None."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() or None if scheme.lower() == "bearer" else None
    return None


class BodyTimeout:
    """Close a request to `paths` whose body parts come more than `seconds` apart (JSON 408, `Connection: close`)."""

    class _Stalled(Exception):
        pass

    def __init__(self, app: ASGIApp, seconds: float, paths: tuple[str, ...]):
        self.app, self.seconds, self.paths = app, seconds, paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in self.paths:
            await self.app(scope, receive, send)
            return

        body_done = stalled = False

        async def timed_receive() -> Message:
            nonlocal body_done, stalled
            if body_done:  # the body is in: what follows (a disconnect, while the answer streams) may take long
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.seconds)
            except asyncio.TimeoutError:
                stalled = True
                raise self._Stalled from None
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def send_unless_stalled(message: Message) -> None:
            if not stalled:
                await send(message)

        try:
            await self.app(scope, timed_receive, send_unless_stalled)
        except self._Stalled:
            pass
        if stalled:
            detail = f"the request body stalled: nothing arrived for {self.seconds:g} s"
            await error_response(408, "body_timeout", detail, {"Connection": "close"})(scope, receive, send)


class ContentLengthLimit:
    """Refuse, before reading it, a body whose declared Content-Length exceeds the limit (JSON 413 naming
    ``setting``); the limit is left in the scope for the 413 of bodies counted as they stream in."""

    def __init__(self, app: ASGIApp, max_bytes: int, paths: tuple[str, ...], setting: str):
        self.app, self.max_bytes, self.paths, self.setting = app, max_bytes, paths, setting

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") in self.paths:
            declared = None
            for name, value in scope.get("headers", []):
                if name == b"content-length":
                    try:
                        declared = int(value)
                    except ValueError:
                        declared = None
            if declared is not None and declared > self.max_bytes:
                await upload_too_large(self.max_bytes, self.setting, declared)(scope, receive, send)
                return
            scope[UPLOAD_LIMIT_KEY] = (self.max_bytes, self.setting)
        await self.app(scope, receive, send)
