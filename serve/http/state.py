"""The state of one service app (`app.state.service`) and the route dependencies that read it.

The dependencies are module-level functions, so `app.dependency_overrides` can replace them.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from serve.http import imaging
from serve.http.access import FailureLimiter, KeyRing, client_of, too_many_attempts
from serve.engine.batching import Batcher, BatchError
from serve.http.drain import Drain
from serve.engine.runner import ModelRunner
from serve.http.errors import ServiceError, field_hints, form_fields, from_coded_error
from serve.http.memory import MemoryBudget
from serve.http.metrics import ServiceMetrics
from serve.settings import ServeSettings


@dataclass
class ServiceState:
    settings: ServeSettings
    metrics: ServiceMetrics
    keys: KeyRing
    auth_failures: FailureLimiter
    decoder: imaging.UploadDecoder
    memory: MemoryBudget  # the pixels of full-size images in flight, all requests together
    drain: Drain
    devices: list[torch.device] = field(default_factory=list)  # one runner each, loaded at startup
    runners: list[ModelRunner] = field(default_factory=list)
    batcher: Batcher | None = None
    ready: bool = False
    status: str = "starting"
    on_ready: Callable[[], None] | None = None  # called once, when the model is warm (`python -m serve` says where)

    @property
    def runner(self) -> ModelRunner:
        return self.runners[0]

    def begin_drain(self) -> None:
        self.drain.begin()
        self.ready = False
        self.status = "draining"
        self.metrics.ready.set(0)


def get_state(request: Request) -> ServiceState:
    return request.app.state.service


def check_room(state: ServiceState, scope) -> None:
    """503 with Retry-After, before the body is read, for a request the queue or the memory budget would refuse."""
    if state.batcher is None:
        return
    with counted_refusal(state):
        state.batcher.check_room()
        state.memory.check(state.settings.request_timeout_s)


@contextlib.contextmanager
def counted_refusal(state: ServiceState) -> Iterator[None]:
    """A batcher's or the memory budget's refusal, counted and raised as its `ServiceError`."""
    try:
        yield
    except BatchError as e:
        state.metrics.rejected.labels(e.code).inc()
        raise from_coded_error(e) from e


def require_loaded(state: ServiceState) -> ServiceState:
    """`state` once the model is loaded; 503 (Retry-After: 5) before."""
    if state.batcher is None or not state.runners:
        raise ServiceError(503, "not_ready", f"the model is not loaded ({state.status})", {"Retry-After": "5"})
    return state


bearer = HTTPBearer(auto_error=False, description="API key, when the service sets STYLEVAR_API_KEYS")
UNAUTHORIZED = "a valid API key is required (Authorization: Bearer KEY)"


def check_key(state: ServiceState, scope, key: str | None) -> None:
    """With API keys set, `key` must be one (401) unless its client failed too often (429, first); counts wrong keys."""
    if not state.keys:
        return
    if not key:
        raise ServiceError(401, "unauthorized", UNAUTHORIZED, {"WWW-Authenticate": "Bearer"})
    client = client_of(scope)
    wait = state.auth_failures.retry_after(client)
    if wait is not None:
        raise too_many_attempts(wait)
    if not state.keys.matches(key):
        state.auth_failures.failed(client)
        raise ServiceError(401, "unauthorized", UNAUTHORIZED, {"WWW-Authenticate": "Bearer"})


def require_key(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer),  # noqa: B008
                state: ServiceState = Depends(get_state)) -> None:  # noqa: B008
    """`check_key` on the request's Bearer token, for every route."""
    check_key(state, request.scope, credentials.credentials if credentials is not None else None)


async def refuse_unknown_fields(request: Request, state: ServiceState) -> None:
    """422 naming each undeclared form field and its nearest declared one (unless `allow_unknown_fields`)."""
    if not state.settings.allow_unknown_fields:
        hints = field_hints(form_fields(request), await request.form())
        if hints:
            raise ServiceError(422, "validation_error", "; ".join(hints))
