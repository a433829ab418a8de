"""Operations routes: liveness, readiness and Prometheus metrics.

`metrics_router` is its own router (left out, or behind `require_key`, by `STYLEVAR_METRICS_ACCESS`). All of
them keep answering while the service drains (`ALWAYS_OPEN_PATHS`); `/readyz` then answers 503.
"""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Response
from starlette.concurrency import run_in_threadpool

from serve.http.errors import error_response
from serve.http.schemas import ErrorBody, Health, response_headers
from serve.http.state import ServiceState, get_state

router = APIRouter(tags=["operations"])
metrics_router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is alive."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health,
            responses={503: {"model": ErrorBody, "description": "not ready, or draining",
                             "headers": response_headers("Retry-After")}})
async def readyz(state: ServiceState = Depends(get_state)) -> Any:  # noqa: B008
    """The model is loaded and warmed up, and the service is not draining."""
    if state.drain.draining:
        return error_response(503, "shutting_down", "draining: finishing the requests in flight", {"Retry-After": "5"})
    if not state.ready:
        return error_response(503, "not_ready", state.status, {"Retry-After": "5"})
    return Health(status="ready")


@metrics_router.get("/metrics", response_class=Response,
                    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
async def metrics(state: ServiceState = Depends(get_state)) -> Response:  # noqa: B008
    """Prometheus metrics (rendered on a worker thread: a scrape never holds the event loop)."""
    return Response(await run_in_threadpool(state.metrics.render), media_type=state.metrics.content_type)


ALWAYS_OPEN_PATHS: tuple[str, ...] = tuple(r.path for r in (*router.routes, *metrics_router.routes))
