"""The HTTP API: `create_app(settings)` builds a FastAPI app around a batcher of model workers.

The routes live in `serve.http.routes`, their dependencies and the app's state in `serve.http.state`. The app
keeps no state between requests beyond the loaded model: any number of replicas can run behind a load balancer.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import ipaddress
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.concurrency import run_in_threadpool

import stylevar
from stylevar.loaders.model_dir import check_model_dir
from stylevar.utils.devices import resolve_devices

from serve.http import imaging
from serve.http.access import FailureLimiter, KeyRing, LoginAttemptLimit
from serve.engine.batching import BatchConfig, Batcher
from serve.http.drain import Drain, DrainMiddleware
from serve.engine.runner import ModelRunner, RunnerOptions
from serve.engine.sizing import default_max_batch
from serve.http.errors import ERROR_RESPONSES, install_error_handlers
from serve.http.memory import MemoryBudget, ReleaseWhenAnswered
from serve.http.metrics import ServiceMetrics
from serve.http.middleware import BeforeBody, BodyTimeout, ContentLengthLimit, RequestMiddleware, bearer_token
from serve.http import openapi
from serve.http.openapi import DocumentShape
from serve.http.routes import docs, index, model, operations, stylize, video
from serve.http.routes.index import UI_PATH
from serve.http.schemas import HEADERS
from serve.settings import ServeSettings, env_name
from serve.http.state import ServiceState, check_key, check_room, require_key

if TYPE_CHECKING:
    from web import MountConfig

UPLOAD_PATHS = (*stylize.PATHS, video.PATH)  # every route that takes uploads: key and body timeout first
log = logging.getLogger("serve.http.app")

UI_LOGIN_PATH = f"{UI_PATH}/login"  # Gradio's login form of the mounted UI
UiMounter = Callable[[FastAPI, ServeSettings], None]


# ---- the web UI -----------------------------------------------------------------------------------
def ui_config(settings: ServeSettings) -> MountConfig:
    from web import MountConfig
    return MountConfig(host=settings.host, port=settings.port, path=UI_PATH, api_keys=tuple(settings.api_keys),
                       request_timeout_s=settings.request_timeout_s, max_upload_bytes=settings.max_upload_bytes,
                       blocked=(settings.model_dir,))


def default_ui_mounter(app: FastAPI, settings: ServeSettings) -> None:
    try:
        import web
    except ImportError as e:
        log.warning("UI not mounted: the web package is missing (%s)", e)
        return
    mount_ui = getattr(web, "mount_ui", None)
    if mount_ui is None:
        log.warning("UI not mounted: web.mount_ui is not available")
        return
    mount_optional_ui(lambda app_, settings_: mount_ui(app_, ui_config(settings_)), app, settings)


def mount_optional_ui(mount_ui: UiMounter, app: FastAPI, settings: ServeSettings) -> bool:
    """Call `mount_ui`; a missing Gradio is logged and skipped (the API runs without a UI)."""
    try:
        mount_ui(app, settings)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in ("gradio", "gradio_client"):
            raise
        log.warning("UI not mounted: %s (install the web extra: pip install 'stylevar[web]')", e)
        return False
    return True


# ---- the app --------------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: ServiceState = app.state.service
    settings = state.settings
    if not state.runners:  # `python -m serve` loads them before the server starts
        await run_in_threadpool(load_runners, state)
    max_batch = settings.max_batch_size or default_max_batch(state.runners)
    log.info("batches of at most %d rows%s", max_batch, "" if settings.max_batch_size else " (from device memory)")
    state.batcher = Batcher(
        [r.run for r in state.runners],
        BatchConfig(max_batch, settings.max_wait_ms / 1000.0, settings.queue_size,
                    settings.max_queue_wait_s or None, settings.worker_nice),
        observer=state.metrics,
    )
    state.batcher.start()
    warm = threading.Thread(target=_warm_up, args=(state,), name="stylevar-warmup", daemon=True)
    warm.start()
    try:
        yield
    finally:
        state.ready = False
        state.status = "stopping"
        state.metrics.ready.set(0)
        if state.drain.draining:  # what is left of the drain: a batch still running then is not waited for long
            stop_s = join_s = max(1.0, state.drain.time_left_s())
        else:
            stop_s, join_s = 30.0, 60.0
        await run_in_threadpool(state.batcher.stop, stop_s)
        await run_in_threadpool(warm.join, join_s)


def load_runners(state: ServiceState) -> None:
    state.status = "loading model"
    options = RunnerOptions.from_settings(state.settings)
    state.runners = [ModelRunner.load(state.settings.model_dir, d, options, state.metrics) for d in state.devices]


def create_app(settings: ServeSettings | None = None, *, ui_mounter: UiMounter | None = None) -> FastAPI:
    """Build the service (the model loads at startup); `ui_mounter` mounts the web UI (default: `web.mount_ui`)."""
    settings = settings or ServeSettings()
    model_config = check_model_dir(settings.model_dir)
    state = _service_state(settings)
    if not state.keys and not _is_loopback(settings.host):
        log.warning("listening on %s without API keys: anyone who reaches this port can use the service and "
                    "its UI; set STYLEVAR_API_KEYS", settings.host)

    app = FastAPI(
        title="StyleVAR",
        version=stylevar.__version__,
        description="Reference-based image style transfer with a Visual Autoregressive model.",
        lifespan=lifespan,
        docs_url=None, redoc_url=None,  # served from the service's own files (serve.http.routes.docs)
        openapi_url="/openapi.json" if settings.docs else None,
        generate_unique_id_function=lambda route: route.name,  # operationId: the route's function (`stylize`)
    )
    app.state.service = state
    install_error_handlers(app)
    _add_middleware(app, state)
    _include_routers(app, settings)
    if settings.docs:
        docs.install(app)
    openapi.install(app, DocumentShape(keys=bool(state.keys), scales=len(model_config.transformer.patch_nums),
                                       closed_forms=not settings.allow_unknown_fields))
    if settings.ui:
        (ui_mounter or default_ui_mounter)(app, settings)
    else:
        log.info("UI disabled (--no-ui)")
    return app


def _service_state(settings: ServeSettings) -> ServiceState:
    metrics = ServiceMetrics()
    return ServiceState(
        settings=settings, metrics=metrics, keys=KeyRing(settings.api_keys),
        auth_failures=FailureLimiter(settings.auth_max_failures, settings.auth_failure_window_s),
        decoder=imaging.UploadDecoder(max_pixels=settings.max_pixels,
                                      max_whole_pixels=settings.max_whole_decode_pixels,
                                      concurrency=settings.decode_concurrency),
        memory=MemoryBudget(settings.max_pixels_in_flight, metrics),
        devices=resolve_devices(settings.device),
        drain=Drain(settings.drain_timeout_s),
    )


def _add_middleware(app: FastAPI, state: ServiceState) -> None:
    """The middleware stack, innermost first (each `add_middleware` wraps the ones before it)."""
    settings = state.settings
    # innermost: a request's pixels (serve.http.memory) go back once its answer is sent, whatever happened
    app.add_middleware(ReleaseWhenAnswered, paths=stylize.PATHS)
    # so that its refusals carry the CORS headers, the request id and the access log line
    app.add_middleware(DrainMiddleware, drain=state.drain, always_open=operations.ALWAYS_OPEN_PATHS,
                       untracked_prefixes=(UI_PATH,), max_discard_bytes=settings.max_upload_bytes)
    # the UI's upload route too: the whole call (all its files) within the API's request limit
    app.add_middleware(ContentLengthLimit, max_bytes=settings.max_upload_bytes,
                       paths=(*stylize.PATHS, f"{UI_PATH}/gradio_api/upload"), setting=env_name("max_upload_bytes"))
    app.add_middleware(ContentLengthLimit, max_bytes=settings.max_video_upload_bytes, paths=(video.PATH,),
                       setting=env_name("max_video_upload_bytes"))
    app.add_middleware(BodyTimeout, seconds=settings.body_timeout_s, paths=UPLOAD_PATHS)
    # a request the queue would refuse now costs no form parsing (the route checks again when it takes a slot)
    app.add_middleware(BeforeBody, check=functools.partial(check_room, state), paths=stylize.PATHS,
                       discard_bytes=settings.max_upload_bytes, stall_s=settings.body_timeout_s)
    # outside the length limit: a keyless request is refused for its key, whatever it declares
    app.add_middleware(BeforeBody, check=lambda scope: check_key(state, scope, bearer_token(scope)), paths=UPLOAD_PATHS)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
            expose_headers=list(HEADERS),  # every header an answer declares, readable by a page's script
        )
    app.add_middleware(LoginAttemptLimit, limiter=state.auth_failures, paths=(UI_LOGIN_PATH,))
    app.add_middleware(RequestMiddleware, metrics=state.metrics)


def _include_routers(app: FastAPI, settings: ServeSettings) -> None:
    app.include_router(index.router)
    app.include_router(operations.router)
    if settings.metrics_access != "off":
        keyed = settings.metrics_access == "key"
        app.include_router(operations.metrics_router, dependencies=[Depends(require_key)] if keyed else None,
                           responses={s: ERROR_RESPONSES[s] for s in (401, 429)} if keyed else None)
    app.include_router(model.router)
    app.include_router(stylize.router, max_body_size=settings.max_upload_bytes)
    video.include(app, settings)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def freeze_startup_heap() -> None:
    """Collect once, then move the survivors (libraries, model, UI) to the collector's permanent generation."""
    gc.collect()
    gc.freeze()


def _warm_up(state: ServiceState) -> None:
    try:
        if state.settings.warmup or state.settings.compile:  # a compiled model compiles here, not on a request
            state.status = "warming up"
            for runner in state.runners:
                runner.warmup()
        if state.drain.draining:  # stopped while warming up: it stays not ready
            return
        if state.settings.gc_freeze:
            freeze_startup_heap()
        state.ready = True
        state.status = "ready"
        state.metrics.ready.set(1)
        if state.on_ready is not None:
            state.on_ready()
    except Exception:
        log.exception("warm-up failed")
        state.status = "warm-up failed"
