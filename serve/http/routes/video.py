"""`POST /stylize/video`: a short clip re-drawn in the style of one image (or a blend), answered as an H.264 mp4.

The clip is checked against the service's limits from its header and again while decoding, then stylized on a
thread of its own, `video_concurrency` clips at a time (one more is 503 `busy`). A clip past `video_timeout_s`,
whose client left, or near the drain's end is stopped between two frames.
"""
from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

from fastapi import APIRouter, Depends, File, Form, Request, UploadFile
from fastapi.responses import Response
from pydantic import Field, create_model
from pydantic.json_schema import SkipJsonSchema
from starlette.concurrency import run_in_threadpool

from stylevar.pipelines.options import FORM, IMAGE_ONLY, Option, offered
from stylevar.processing.postprocess import MAX_STYLES, os_random_seed
from stylevar.processing.video import (DEFAULT_TEMPORAL, EXTRA, TEMPORAL_HELP, TEMPORAL_MODES, VideoError,
                                       VideoInfo, VideoLimits, count_frames, probe)
from stylevar.utils.extras import install_line, missing_modules

from serve.engine.batching import lower_priority, run_or_overloaded
from serve.http.errors import ERROR_RESPONSES, ServiceError, from_coded_error
from serve.http.negotiation import BYTES_MEDIA_TYPE, binary_media
from serve.http.schemas import ErrorBody, FormOptions, form_field, response_headers
from serve.http.state import ServiceState, get_state, refuse_unknown_fields, require_key, require_loaded
from serve.http.routes.stylize import (BINARY, MASK_COUNT, REFERENCE_SIDE, STYLE_COUNT, check_alphas, check_mix,
                                       decode_uploads, header_safe, reference_plan)

log = logging.getLogger("serve.video")

PATH = "/stylize/video"
STOP_MARGIN_S = 1.0  # a clip is stopped when what is left of the drain is under twice its longest frame step plus this
VIDEO_OPTIONS = [opt for opt in offered(FORM) if opt.name not in IMAGE_ONLY]

router = APIRouter(dependencies=[Depends(require_key)])


class VideoOptions(FormOptions):
    OPTIONS: ClassVar[list[Option]] = VIDEO_OPTIONS


VideoForm = create_model(
    "VideoForm", __base__=VideoOptions, __module__=__name__,
    __doc__="Options of `POST /stylize/video` (form fields): those of `/stylize` but the sample count and format.",
    temporal=(Literal[TEMPORAL_MODES], Field(DEFAULT_TEMPORAL, description=TEMPORAL_HELP)),  # type: ignore[valid-type]
    **{opt.name: form_field(opt) for opt in VIDEO_OPTIONS},
)

VideoUpload = Annotated[UploadFile, File(description="the clip: MP4/MOV, MKV/WebM, AVI, MPEG-TS ... within the "
                                                     "limits in this route's description")]
StyleUploads = Annotated[list[UploadFile], File(
    description=f"style image (JPEG, PNG, WebP); repeat the field for a blend of up to {MAX_STYLES} styles",
    json_schema_extra=STYLE_COUNT)]
MaskUploads = Annotated[Union[list[UploadFile], SkipJsonSchema[None]], File(
    description="optional: one grayscale mask per `style` file (white = the style applies), resized to each frame",
    json_schema_extra=MASK_COUNT)]


class VideoGate:
    """At most `slots` clips at a time, each on one of its threads at CPU priority `nice` below the process's."""

    def __init__(self, slots: int, nice: int = 0):
        self._free = threading.BoundedSemaphore(slots)
        self.threads = ThreadPoolExecutor(slots, thread_name_prefix="stylevar-video", initializer=lower_priority,
                                          initargs=(nice,))

    def take(self) -> bool:
        return self._free.acquire(blocking=False)

    def give(self) -> None:
        self._free.release()


class ClipWork:
    """One clip's temporary folder and gate slot, given back once the route and the clip's thread are both done
    (a stopped clip finishes its frame after the route has answered). Event loop only."""

    def __init__(self, gate: VideoGate):
        self.gate, self.folder = gate, Path(tempfile.mkdtemp(prefix="stylevar-video-"))
        self._users = 1  # the route

    def run(self, fn) -> asyncio.Future:
        task = asyncio.get_running_loop().run_in_executor(self.gate.threads, fn)
        self._users += 1
        task.add_done_callback(self._thread_done)
        return task

    def _thread_done(self, task: asyncio.Future) -> None:
        if not task.cancelled():
            task.exception()  # retrieved here, whoever else looks: Stopped, or what ended it
        self.done()

    def done(self) -> None:
        self._users -= 1
        if self._users == 0:
            self.gate.give()
            shutil.rmtree(self.folder, ignore_errors=True)


class StepClock:
    """The longest time between two frame steps of a clip, the step under way included."""

    def __init__(self) -> None:
        self._last = time.monotonic()
        self._longest = 0.0

    def step(self) -> None:
        now = time.monotonic()
        self._longest, self._last = max(self._longest, now - self._last), now

    def longest_s(self) -> float:
        return max(self._longest, time.monotonic() - self._last)


class Stopped(Exception):
    """The clip was stopped between two frames (deadline or disconnect)."""


def limits_of(state: ServiceState) -> VideoLimits:
    s = state.settings
    return VideoLimits(max_duration_s=s.max_video_duration_s, max_frames=s.max_video_frames,
                       max_pixels=s.max_video_pixels)


def video_error(e: VideoError, name: str = "video") -> ServiceError:
    """A clip's refusal (415, 413 or 422), naming the upload, not the temporary file."""
    detail = str(e).split(": ", 1)[-1]
    return from_coded_error(e, f"{name}: {detail}")


async def save_upload(upload: UploadFile, path: Path) -> None:
    await upload.seek(0)
    with open(path, "wb") as f:
        while chunk := await upload.read(1 << 20):
            f.write(chunk)


async def decode_styles(st: ServiceState, styles: list[UploadFile], masks: list[UploadFile] | None):
    plan = reference_plan(styles, masks, max(REFERENCE_SIDE, st.runner.pipe.image_size))
    out = [d.image for d in await decode_uploads(st, plan)]
    return out[:len(styles)], out[len(styles):] or None


@router.post(
    PATH, response_class=Response,
    responses={200: {"content": {"video/mp4": BINARY, BYTES_MEDIA_TYPE: BINARY},
                     "description": "the stylized clip, H.264 mp4, with the source's frame rate, timing and audio "
                                    "(as application/octet-stream when the Accept header names it)",
                     "headers": response_headers("X-Seed", "X-Frames", "X-Fps", "X-Inference-Ms", "X-Temporal",
                                                 "X-Model", "X-Audio")},
               **ERROR_RESPONSES, 501: {"model": ErrorBody, "description": "video is not installed in this service"}},
)
async def stylize_video(request: Request, video: VideoUpload, style: StyleUploads,
                        form: Annotated[VideoForm, Form()], state: Annotated[ServiceState, Depends(get_state)],
                        style_mask: MaskUploads = None) -> Response:
    """Re-draw every frame of `video` in the style of `style`: a short clip, within the limits below."""
    await refuse_unknown_fields(request, state)
    require_extra()
    st = require_loaded(state)
    req = form.request()
    if req.seed is None:
        req = req.model_copy(update={"seed": os_random_seed()})  # a valid seed: no second validation
    check_mix(style, style_mask, req.style_weights)
    check_alphas(req.alphas, len(st.runner.pipe.config.transformer.patch_nums))
    gate: VideoGate = request.app.state.video_gate
    if not gate.take():
        raise ServiceError(503, "busy", "the service is stylizing as many clips as it takes at once; try again "
                                        "shortly", {"Retry-After": "5"})
    clip = ClipWork(gate)
    try:
        src, out = clip.folder / "input", clip.folder / "output.mp4"
        await save_upload(video, src)
        limits = limits_of(st)
        info = await _probe(src, limits)
        styles, masks = await decode_styles(st, style, style_mask)
        kwargs = {"request": req, "style_masks": masks, "temporal": form.temporal,
                  "batch_size": st.batcher.config.max_batch_size, "max_side": st.settings.max_output_side,
                  "limits": limits, "info": info}
        result, seconds = await _run(request, st, clip, src, styles, out, kwargs)
        headers = {"X-Seed": str(req.seed), "X-Frames": str(result.frames), "X-Fps": f"{float(result.fps):g}",
                   "X-Inference-Ms": f"{seconds * 1000:.1f}", "X-Temporal": form.temporal,
                   "X-Model": header_safe(st.runner.pipe.config.name), "X-Audio": "1" if result.audio else "0"}
        log.info("video done", extra={"frames": result.frames, "seconds": round(seconds, 3), "codec": info.codec})
        return Response(out.read_bytes(), media_type=binary_media(request, "video/mp4"), headers=headers)
    finally:
        clip.done()


def require_extra() -> None:
    missing = missing_modules(EXTRA)
    if missing:
        raise ServiceError(501, "not_installed", f"this service cannot do video: {', '.join(missing)} is not "
                                                 f"installed ({install_line(EXTRA, paths=False)})")


def probe_and_count(src: Path, limits: VideoLimits) -> VideoInfo:
    """The clip's header, and its frames counted from its packets: both within `limits` (else a VideoError)."""
    info = probe(src, limits)
    count_frames(src, limits)
    return info


async def _probe(src: Path, limits: VideoLimits) -> VideoInfo:
    try:
        return await run_in_threadpool(probe_and_count, src, limits)
    except VideoError as e:
        raise video_error(e) from e


async def _run(request: Request, st: ServiceState, clip: ClipWork, src: Path, styles: list, out: Path, kwargs: dict):
    """`stylize_video` on the clip's thread; however the route ends, the thread is told to stop between frames."""
    stop, steps = threading.Event(), StepClock()

    def progress(done: int, total: int | None) -> None:
        steps.step()
        if stop.is_set():
            raise Stopped()

    def stylize() -> Any:  # out of memory: 503 `out_of_memory` with Retry-After, as an image that does not fit
        return run_or_overloaded(lambda: st.runner.pipe.stylize_video(src, styles, out, progress=progress, **kwargs),
                                 "the clip does not fit in device memory now; try again shortly, or send a "
                                 "smaller clip")

    t0 = time.perf_counter()
    task = clip.run(stylize)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                return task.result(), time.perf_counter() - t0
            check_clip(st, request.state.arrived, steps)
            if await request.is_disconnected():
                raise ServiceError(499, "client_gone", "the client went away")
    except VideoError as e:  # found while decoding (a truncated clip, a header that lied about its length)
        raise video_error(e) from e
    finally:
        stop.set()  # a no-op once the thread is done


def check_clip(st: ServiceState, arrived: float, steps: StepClock) -> None:
    """504 past the video deadline, 503 `shutting_down` when the drain has too little time left for the clip."""
    if time.monotonic() > arrived + st.settings.video_timeout_s:
        raise ServiceError(504, "deadline_exceeded", f"the clip took longer than the service's video "
                                                     f"deadline of {st.settings.video_timeout_s:g} s")
    drain = st.drain
    if drain.draining and drain.time_left_s() <= 2 * steps.longest_s() + STOP_MARGIN_S:
        raise ServiceError(503, "shutting_down", "the service is shutting down; the clip was stopped",
                           {"Retry-After": "1"})


def limits_text(settings: Any) -> str:
    return (f"Limits of this service: at most {settings.max_video_duration_s:g} s, {settings.max_video_frames} frames, "
            f"{settings.max_video_pixels} pixels a frame, {settings.max_video_upload_bytes} bytes uploaded "
            f"(STYLEVAR_MAX_VIDEO_DURATION_S, _FRAMES, _PIXELS, _UPLOAD_BYTES); {settings.video_concurrency} clip(s) "
            f"at a time, each within {settings.video_timeout_s:g} s (STYLEVAR_VIDEO_CONCURRENCY, _TIMEOUT_S).")


def include(app: Any, settings: Any) -> None:
    """Add the route with its body limit and gate; the app's OpenAPI schema states the limits (also as ``x-limits``)."""
    app.include_router(router, max_body_size=settings.max_video_upload_bytes)
    app.state.video_gate = VideoGate(settings.video_concurrency, settings.worker_nice)
    schema_of = app.openapi
    limits = {"max_duration_s": settings.max_video_duration_s, "max_frames": settings.max_video_frames,
              "max_pixels": settings.max_video_pixels, "max_upload_bytes": settings.max_video_upload_bytes}

    def openapi() -> dict:
        if app.openapi_schema is None:
            op = schema_of()["paths"][PATH]["post"]  # builds and caches app.openapi_schema
            op["description"] = f"{op.get('description', '')}\n\n{limits_text(settings)}"
            op["x-limits"] = limits
        return app.openapi_schema

    app.openapi = openapi
