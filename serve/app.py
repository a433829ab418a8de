"""The HTTP API: `create_app(settings)` builds a FastAPI app around a batcher of model workers.

The app keeps no state between requests beyond the loaded model, so any number of replicas can run
behind a load balancer.
"""
from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import torch
from fastapi import Depends, FastAPI, File, Form, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from PIL import Image
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

import stylevar
from stylevar.images import ImageError, fit_of, tensor_to_pil, unfit
from stylevar.pipeline import MAX_STYLES, StyleMix, check_model_dir
from stylevar.postprocess import OutputOptions, finish, os_random_seed, sample_seeds

from . import imaging
from .access import FailureLimiter, KeyRing, LoginAttemptLimit, client_of, too_many_attempts
from .batching import (
    BatchConfig,
    BatchError,
    Batcher,
    Job,
    OverloadedError,
    QueueFullError,
    StoppedError,
)
from .engine import GenerationKey, ModelRunner, PreviewFn, RunnerOptions, StylizeTask, resolve_devices
from .metrics import ServiceMetrics
from .middleware import ContentLengthLimit, RequestMiddleware
from .schemas import ErrorBody, Health, ImageOut, ModelInfo, StylizeForm, StylizeResult
from .settings import ServeSettings

ContentUpload = Annotated[UploadFile, File(description="content image (JPEG, PNG, WebP)")]
StyleUploads = Annotated[list[UploadFile], File(
    description=f"style image (JPEG, PNG, WebP); repeat the field for a blend of up to {MAX_STYLES} styles "
                "(weights: `style_weights`)")]
MaskUploads = Annotated[list[UploadFile] | None, File(
    description="optional: one grayscale mask per `style` file, in their order (white = the style applies, black = "
                "the content stays, grey = partly); any size, resized to the content's; an image of any "
                "accepted format")]

log = logging.getLogger("serve.app")

UI_LOGIN_PATH = "/ui/login"  # Gradio's login form where web.mount_ui mounts the UI
IMAGE_ERROR_STATUS = {"not_an_image": 415, "corrupt_image": 422, "image_too_large": 413, "bad_image": 422}
BATCH_ERROR_STATUS = {"queue_full": 503, "out_of_memory": 503, "shutting_down": 503, "deadline_exceeded": 504,
                      "inference_failed": 500}
HTTP_ERROR_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
                    405: "method_not_allowed", 406: "not_acceptable", 413: "payload_too_large",
                    415: "unsupported_media_type", 422: "validation_error", 429: "too_many_attempts",
                    503: "unavailable"}
POLL_S = 0.25  # how often a waiting request checks for a client disconnect
UiMounter = Callable[[FastAPI, ServeSettings], None]


class ServiceError(Exception):
    """An error answered as `{"error": code, "detail": detail}` with `status`."""

    def __init__(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status, self.code, self.detail, self.headers = status, code, detail, headers or {}


class ClientGone(Exception):
    """The client disconnected while its job waited."""


def error_response(status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status, headers=headers)


def _from_batch_error(e: BatchError) -> ServiceError:
    headers = {}
    if isinstance(e, QueueFullError):
        headers["Retry-After"] = str(e.retry_after_s)
    elif isinstance(e, (OverloadedError, StoppedError)):
        headers["Retry-After"] = "1"
    return ServiceError(BATCH_ERROR_STATUS.get(e.code, 500), e.code, str(e), headers)


@dataclass
class ServiceState:
    settings: ServeSettings
    metrics: ServiceMetrics
    keys: KeyRing
    auth_failures: FailureLimiter
    decoder: imaging.UploadDecoder
    runners: list[ModelRunner] = field(default_factory=list)
    batcher: Batcher | None = None
    ready: bool = False
    status: str = "starting"

    @property
    def runner(self) -> ModelRunner:
        return self.runners[0]


# ---- HTTP helpers ---------------------------------------------------------------------------------
def _accepts(request: Request) -> dict[str, float]:
    """Accept header -> {media range: q}; a missing header accepts anything."""
    header = request.headers.get("accept")
    if not header:
        return {"*/*": 1.0}
    out: dict[str, float] = {}
    for part in header.split(","):
        media, *params = [p.strip() for p in part.split(";")]
        q = 1.0
        for p in params:
            if p.startswith("q="):
                try:
                    q = float(p[2:])
                except ValueError:
                    q = 0.0
        if media:
            out[media.lower()] = max(q, out.get(media.lower(), 0.0))
    return out


def _quality(accepts: dict[str, float], media_type: str) -> float:
    major = media_type.split("/")[0]
    for candidate in (media_type, f"{major}/*", "*/*"):
        if candidate in accepts:
            return accepts[candidate]
    return 0.0


ZIP_MEDIA_TYPE = "application/zip"
Representation = Literal["image", "json", "zip"]


def negotiate(request: Request, media_type: str, num_samples: int) -> Representation:
    """What `/stylize` answers, from the Accept header (docs/serving.md, "Response format").

    JSON only when the client names `application/json` (a wildcard never selects it); otherwise one
    sample is the image (`media_type`) and several are a zip archive with one image per sample. Of
    the acceptable ones the highest q wins; a tie goes to JSON (it was named).
    """
    accepts = _accepts(request)
    offers: dict[Representation, float] = {
        "json": accepts.get("application/json", 0.0),
        "image": _quality(accepts, media_type) if num_samples == 1 else 0.0,
        "zip": _quality(accepts, ZIP_MEDIA_TYPE) if num_samples > 1 else 0.0,
    }
    best = max(offers, key=lambda name: offers[name])  # dict order breaks ties: json first
    if offers[best] > 0:
        return best
    produced = media_type if num_samples == 1 else f"{ZIP_MEDIA_TYPE} (several samples)"
    raise ServiceError(406, "not_acceptable", f"this request returns {produced} or application/json")


async def wait_for_job(job: Job, request: Request) -> Any:
    """The job's result; drops the job when the client goes away or the deadline passes."""
    afut = asyncio.wrap_future(job.future)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, job.deadline - time.monotonic())
    try:
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise ServiceError(504, "deadline_exceeded", "the request took longer than the service's deadline")
            done, _ = await asyncio.wait({afut}, timeout=min(POLL_S, left))
            if done:
                try:
                    return afut.result()
                except BatchError as e:
                    raise _from_batch_error(e) from e
            if await request.is_disconnected():
                raise ClientGone()
    finally:
        if not afut.done():
            afut.cancel()  # also cancels the job if a worker has not taken it yet


# ---- the app --------------------------------------------------------------------------------------
def default_ui_mounter(app: FastAPI, settings: ServeSettings) -> None:
    """Mount the Gradio UI at /ui when the `web` package provides `mount_ui(app, settings)`."""
    try:
        import web
    except ImportError as e:
        log.warning("UI not mounted: the web package is missing (%s)", e)
        return
    mount_ui = getattr(web, "mount_ui", None)
    if mount_ui is None:
        log.warning("UI not mounted: web.mount_ui is not available")
        return
    mount_optional_ui(mount_ui, app, settings)


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


def create_app(settings: ServeSettings | None = None, *, ui_mounter: UiMounter | None = None) -> FastAPI:
    """Build the service. The model is loaded at startup (lifespan) and warmed up in the background.

    `ui_mounter` mounts the web UI (default: `web.mount_ui`); it is skipped when `settings.ui` is off.
    """
    settings = settings or ServeSettings()
    check_model_dir(settings.model_dir)
    devices = resolve_devices(settings.device)
    state = ServiceState(
        settings=settings, metrics=ServiceMetrics(), keys=KeyRing(settings.api_keys),
        auth_failures=FailureLimiter(settings.auth_max_failures, settings.auth_failure_window_s),
        decoder=imaging.UploadDecoder(max_pixels=settings.max_pixels,
                                      max_whole_pixels=settings.max_whole_decode_pixels,
                                      concurrency=settings.decode_concurrency),
    )
    if not state.keys and not _is_loopback(settings.host):
        log.warning("listening on %s without API keys: anyone who reaches this port can use the service and "
                    "its UI; set STYLEVAR_API_KEYS", settings.host)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.status = "loading model"
        state.runners = await run_in_threadpool(
            lambda: [ModelRunner.load(settings.model_dir, d, RunnerOptions.from_settings(settings), state.metrics)
                     for d in devices]
        )
        state.batcher = Batcher(
            [r.run for r in state.runners],
            BatchConfig(settings.max_batch_size, settings.max_wait_ms / 1000.0, settings.queue_size),
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
            await run_in_threadpool(state.batcher.stop)
            await run_in_threadpool(warm.join, 60.0)

    app = FastAPI(
        title="StyleVAR",
        version=stylevar.__version__,
        description="Reference-based image style transfer with a Visual Autoregressive model.",
        lifespan=lifespan,
        docs_url="/docs" if settings.docs else None,
        redoc_url="/redoc" if settings.docs else None,
        openapi_url="/openapi.json" if settings.docs else None,
    )
    app.state.service = state
    _install_error_handlers(app)
    app.add_middleware(ContentLengthLimit, max_bytes=settings.max_upload_bytes,
                       paths=("/stylize", "/stylize/stream"))
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
            expose_headers=["X-Seed", "X-Inference-Ms", "X-Model", "X-Request-ID", "Retry-After"],
        )
    app.add_middleware(LoginAttemptLimit, limiter=state.auth_failures, paths=(UI_LOGIN_PATH,))
    app.add_middleware(RequestMiddleware, metrics=state.metrics)
    _add_routes(app, state)
    if settings.ui:
        (ui_mounter or default_ui_mounter)(app, settings)
    else:
        log.info("UI disabled (--no-ui)")
    return app


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def _warm_up(state: ServiceState) -> None:
    try:
        if state.settings.warmup or state.settings.compile:  # a compiled model compiles here, not on a request
            state.status = "warming up"
            for runner in state.runners:
                runner.warmup()
        state.ready = True
        state.status = "ready"
        state.metrics.ready.set(1)
    except Exception:
        log.exception("warm-up failed")
        state.status = "warm-up failed"


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.detail, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = HTTP_ERROR_CODES.get(exc.status_code, f"http_{exc.status_code}")
        return error_response(exc.status_code, code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors():
            loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
            parts.append(f"{loc}: {err.get('msg', 'invalid')}" if loc else str(err.get("msg", "invalid")))
        return error_response(422, "validation_error", "; ".join(parts) or "invalid request")


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text}
    for status, text in {
        401: "missing or wrong API key", 429: "too many wrong API keys from this client (see Retry-After)",
        406: "the requested media type cannot be produced",
        413: "upload too large (bytes or pixels)", 415: "not a JPEG, PNG or WebP image",
        422: "invalid field or corrupt image", 503: "queue full or not ready (see Retry-After)",
        504: "deadline exceeded",
    }.items()
}
IMAGE_CONTENT = {m: {"schema": {"type": "string", "format": "binary"}}
                 for m in (*imaging.MEDIA_TYPES.values(), ZIP_MEDIA_TYPE)}


def _add_routes(app: FastAPI, state: ServiceState) -> None:
    settings = state.settings
    bearer = HTTPBearer(auto_error=False, description="API key, when the service sets STYLEVAR_API_KEYS")

    def require_key(request: Request,
                    credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:  # noqa: B008
        if not state.keys:
            return
        if credentials is None or not credentials.credentials:
            raise ServiceError(401, "unauthorized", "a valid API key is required (Authorization: Bearer KEY)",
                               {"WWW-Authenticate": "Bearer"})
        client = client_of(request.scope)
        wait = state.auth_failures.retry_after(client)
        if wait is not None:  # refused before the key is looked at: no answer tells a guess is right
            body, headers = too_many_attempts(wait)
            raise ServiceError(429, body["error"], body["detail"], headers)
        if not state.keys.matches(credentials.credentials):
            state.auth_failures.failed(client)
            raise ServiceError(401, "unauthorized", "a valid API key is required (Authorization: Bearer KEY)",
                               {"WWW-Authenticate": "Bearer"})

    def loaded() -> ServiceState:
        if state.batcher is None or not state.runners:
            raise ServiceError(503, "not_ready", f"the model is not loaded ({state.status})", {"Retry-After": "5"})
        return state

    @app.get("/healthz", response_model=Health, tags=["operations"])
    async def healthz() -> Health:
        """The process is alive."""
        return Health(status="ok")

    @app.get("/readyz", response_model=Health, tags=["operations"], responses={503: {"model": ErrorBody}})
    async def readyz() -> Any:
        """The model is loaded and warmed up."""
        if not state.ready:
            return error_response(503, "not_ready", state.status, {"Retry-After": "5"})
        return Health(status="ready")

    if settings.metrics_access != "off":
        @app.get("/metrics", tags=["operations"], response_class=Response,
                 dependencies=[Depends(require_key)] if settings.metrics_access == "key" else [],
                 responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
        async def metrics() -> Response:
            """Prometheus metrics."""
            return Response(state.metrics.render(), media_type=state.metrics.content_type)

    @app.get("/v1/model", response_model=ModelInfo, dependencies=[Depends(require_key)],
             responses={401: ERROR_RESPONSES[401], 503: ERROR_RESPONSES[503]})
    async def model_info() -> ModelInfo:
        """The loaded model: configuration, demo flag, devices, dtype and library version."""
        runner = loaded().runner
        cfg = runner.pipe.config
        return ModelInfo(
            name=cfg.name, demo=cfg.demo, version=stylevar.__version__,
            devices=[str(r.device) for r in state.runners], dtype=runner.dtype_name,
            image_size=runner.pipe.image_size, patch_nums=list(cfg.transformer.patch_nums),
            default_alphas=list(cfg.transformer.alpha_nums), vocab_size=cfg.transformer.vocab_size,
            config=cfg.to_dict(),
        )

    def check_mix(styles: list[UploadFile], masks: list[UploadFile] | None, form: StylizeForm) -> None:
        """The counts of style files, weights and masks agree (422 otherwise), before anything is read."""
        n = len(styles)
        if not 1 <= n <= MAX_STYLES:
            raise ServiceError(422, "validation_error", f"style: give 1 to {MAX_STYLES} style files, got {n}")
        weights = form.weight_values()
        if weights is not None and len(weights) != n:
            raise ServiceError(422, "validation_error",
                               f"style_weights: {len(weights)} weights for {n} style file(s); give one per style")
        if masks is not None and len(masks) != n:
            raise ServiceError(422, "validation_error",
                               f"style_mask: {len(masks)} mask(s) for {n} style file(s); give one per style")

    async def prepare(content: UploadFile, styles: list[UploadFile], masks: list[UploadFile] | None,
                      form: StylizeForm, rid: str, on_preview: PreviewFn | None = None) -> tuple[Job, Image.Image]:
        """Check the fields, take a queue slot (503 at once when the queue is full), then decode the
        images (downscaled, a bounded number at a time) and queue the job."""
        st = loaded()
        alphas = form.alpha_values()
        n_scales = len(st.runner.pipe.config.transformer.patch_nums)
        if alphas is not None and len(alphas) != n_scales:
            raise ServiceError(422, "validation_error",
                               f"alphas: the model has {n_scales} scales, got {len(alphas)} values")
        check_mix(styles, masks, form)
        try:
            admission = st.batcher.admit()
        except BatchError as e:
            state.metrics.rejected.labels(e.code).inc()
            raise _from_batch_error(e) from e
        with admission:
            # the content sets the size of the result (at most max_output_side); the model works smaller
            max_side = max(settings.max_output_side, st.runner.pipe.image_size)
            several = len(styles) > 1
            uploads = [("content", content)]
            uploads += [(f"style {i + 1}" if several else "style", u) for i, u in enumerate(styles)]
            uploads += [(f"style_mask {i + 1}" if several else "style_mask", u) for i, u in enumerate(masks or [])]
            images = []
            for name, upload in uploads:
                data = await upload.read()
                try:
                    images.append(await state.decoder.decode(data, max_side=max_side))
                except ImageError as e:
                    raise ServiceError(IMAGE_ERROR_STATUS.get(e.code, 422), e.code, f"{name}: {e}") from e
            seeds = sample_seeds(form.seed if form.seed is not None else os_random_seed(), form.num_samples)
            n = len(styles)
            mix = StyleMix(tuple(images[1:1 + n]), form.weight_values(),
                           tuple(images[1 + n:]) if masks else None).active()
            key = GenerationKey(form.top_k, form.top_p, form.style_strength, alphas, form.resize, form.guidance,
                                len(mix.images))
            task = StylizeTask(images[0], mix.images[0] if mix.plain else mix, seeds, on_preview)
            try:
                job = admission.submit(key, task, rows=len(seeds), timeout_s=settings.request_timeout_s,
                                       request_id=rid)
            except BatchError as e:
                state.metrics.rejected.labels(e.code).inc()
                raise _from_batch_error(e) from e
        return job, images[0]

    def encode(content_img: Image.Image, form: StylizeForm, images: list[Image.Image]
               ) -> tuple[list[bytes], list[Image.Image]]:
        images = finish(images, content_img, OutputOptions(preserve_color=form.preserve_color))
        return [imaging.encode_image(im, form.format) for im in images], images

    def result_json(job: Job, form: StylizeForm, encoded: list[bytes], images: list[Image.Image]) -> dict:
        media = imaging.MEDIA_TYPES[form.format]
        return StylizeResult(
            model=state.runner.pipe.config.name, seed=job.payload.seeds[0], inference_ms=_inference_ms(job),
            images=[ImageOut(seed=s, media_type=media, width=im.width, height=im.height, data=imaging.to_base64(b))
                    for s, b, im in zip(job.payload.seeds, encoded, images)],
        ).model_dump()

    @app.post(
        "/stylize", dependencies=[Depends(require_key)], max_body_size=settings.max_upload_bytes,
        response_class=Response,
        responses={200: {"model": StylizeResult, "content": IMAGE_CONTENT,
                         "description": "the image (several samples: a zip of images), or JSON with base64 images "
                                        "when the Accept header names application/json"},
                   **ERROR_RESPONSES},
    )
    async def stylize(
        request: Request,
        content: ContentUpload,
        style: StyleUploads,
        form: Annotated[StylizeForm, Form()],
        style_mask: MaskUploads = None,
    ) -> Response:
        """Re-draw `content` in the style of `style` (several `style` files: a blend by `style_weights`, each
        confined to its `style_mask` when masks are given)."""
        media = imaging.MEDIA_TYPES[form.format]
        representation = negotiate(request, media, form.num_samples)
        job, content_img = await prepare(content, style, style_mask, form, request.state.request_id)
        try:
            images = await wait_for_job(job, request)
        except ClientGone:
            log.info("client went away; job dropped")
            return Response(status_code=499)
        encoded, images = await run_in_threadpool(encode, content_img, form, images)
        headers = {"X-Seed": str(job.payload.seeds[0]), "X-Inference-Ms": f"{_inference_ms(job):.1f}",
                   "X-Model": _header_safe(state.runner.pipe.config.name), "Vary": "Accept"}
        if representation == "json":
            return JSONResponse(result_json(job, form, encoded, images), headers=headers)
        if representation == "zip":
            headers["Content-Disposition"] = f'attachment; filename="stylevar-seed-{job.payload.seeds[0]}.zip"'
            archive = imaging.zip_images(encoded, job.payload.seeds, form.format)
            return Response(archive, media_type=ZIP_MEDIA_TYPE, headers=headers)
        return Response(encoded[0], media_type=media, headers=headers)

    @app.post(
        "/stylize/stream", dependencies=[Depends(require_key)], max_body_size=settings.max_upload_bytes,
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                         "description": "`preview` events (one per scale, coarse to fine), then `result`"},
                   **ERROR_RESPONSES},
    )
    async def stylize_stream(
        request: Request,
        content: ContentUpload,
        style: StyleUploads,
        form: Annotated[StylizeForm, Form()],
        style_mask: MaskUploads = None,
    ) -> StreamingResponse:
        """Server-Sent Events: a `preview` event per scale, then a `result` event (as the JSON of /stylize)."""
        loop = asyncio.get_running_loop()
        previews: asyncio.Queue[tuple[int, torch.Tensor]] = asyncio.Queue()

        def on_preview(k: int, previews_n3HW: torch.Tensor) -> None:  # called on the worker thread
            loop.call_soon_threadsafe(previews.put_nowait, (k, previews_n3HW))

        job, content_img = await prepare(content, style, style_mask, form, request.state.request_id, on_preview)
        side = state.runner.pipe.image_size
        fit = fit_of(content_img.size, side, form.resize)
        patch_nums = list(state.runner.pipe.config.transformer.patch_nums)

        def preview_event(k: int, previews_n3HW: torch.Tensor) -> str:
            shots = [unfit(tensor_to_pil(p), fit, max_side=side) for p in previews_n3HW]
            data = {"scale": k, "num_scales": len(patch_nums), "patch_num": patch_nums[k],
                    "images": [imaging.to_base64(imaging.encode_image(s, "png")) for s in shots]}
            return _sse("preview", data)

        async def events() -> AsyncIterator[str]:
            afut = asyncio.wrap_future(job.future)
            deadline = loop.time() + max(0.0, job.deadline - time.monotonic())
            try:
                while not afut.done():
                    left = deadline - loop.time()
                    if left <= 0:
                        yield _sse("error", {"error": "deadline_exceeded", "detail": "the request took too long"})
                        return
                    getter = asyncio.ensure_future(previews.get())
                    done, _ = await asyncio.wait({getter, afut}, timeout=min(POLL_S, left),
                                                 return_when=asyncio.FIRST_COMPLETED)
                    if getter in done:
                        yield await run_in_threadpool(preview_event, *getter.result())
                    else:
                        getter.cancel()
                while not previews.empty():
                    yield await run_in_threadpool(preview_event, *previews.get_nowait())
                try:
                    images = afut.result()
                except BatchError as e:
                    err = _from_batch_error(e)
                    yield _sse("error", {"error": err.code, "detail": err.detail})
                    return
                encoded, images = await run_in_threadpool(encode, content_img, form, images)
                yield _sse("result", result_json(job, form, encoded, images))
            finally:
                if not afut.done():
                    afut.cancel()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                          "X-Seed": str(job.payload.seeds[0]),
                                          "X-Model": _header_safe(state.runner.pipe.config.name)})


def _sse(event: str, data: dict) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _inference_ms(job: Job) -> float:
    if job.started_at is None or job.finished_at is None:
        return 0.0
    return (job.finished_at - job.started_at) * 1000.0


def _header_safe(text: str) -> str:
    return "".join(c if 32 <= ord(c) < 127 else "?" for c in text)
