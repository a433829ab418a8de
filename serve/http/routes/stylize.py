"""`POST /stylize` (one answer: image, zip or JSON) and `POST /stylize/stream` (Server-Sent Events).

Both check the form, take a queue slot and the request's pixels, decode the uploads and queue one job (`submit`),
then wait for it (`serve.http.jobs`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

import torch
from fastapi import APIRouter, Depends, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, Response, StreamingResponse
from PIL import Image
from pydantic.json_schema import SkipJsonSchema
from starlette.concurrency import run_in_threadpool

from stylevar.processing.images import (DEFAULT_MAX_PIXELS, Decoded, ImageError, capped_size, decoded_size, fit_of,
                                        tensor_to_pil, unfit)
from stylevar.loaders.preflight import small_image_warning
from stylevar.pipelines.request import StylizeRequest, check_mix_counts
from stylevar.processing.postprocess import MAX_STYLES, os_random_seed, upscale_factor

from serve.http import imaging
from serve.engine.batching import Job
from serve.engine.runner import PreviewFn, StylizeTask
from serve.http.errors import ERROR_RESPONSES, ClientGone, ServiceError, from_coded_error
from serve.http.jobs import follow_job, job_result, wait_for_job
from serve.http.memory import Reservation, hold_until_answered
from serve.http.middleware import bearer_token
from serve.http.negotiation import BYTES_MEDIA_TYPE, ZIP_MEDIA_TYPE, binary_media, negotiate
from serve.http.schemas import ImageOut, StylizeForm, StylizeResult, response_headers
from serve.http.state import (ServiceState, counted_refusal, get_state, refuse_unknown_fields, require_key,
                              require_loaded)

REFERENCE_SIDE = 1024  # long side style images and masks are decoded at (they are used at the model's size)

log = logging.getLogger("serve.stylize")

STYLE_COUNT = {"minItems": 1, "maxItems": MAX_STYLES}  # `check_mix`'s counts, in the schema
MASK_COUNT = {"maxItems": MAX_STYLES}  # none (a form's empty list: the field left out) or one per style
ContentUpload = Annotated[UploadFile, File(description="content image (JPEG, PNG, WebP)")]
StyleUploads = Annotated[list[UploadFile], File(
    description=f"style image (JPEG, PNG, WebP); repeat the field for a blend of up to {MAX_STYLES} styles "
                "(weights: `style_weights`)", json_schema_extra=STYLE_COUNT)]
MaskUploads = Annotated[list[UploadFile] | SkipJsonSchema[None], File(
    description="optional: one grayscale mask per `style` file, in their order (white = the style applies, black = "
                "the content stays, grey = partly); any size, resized to the content's; an image of any "
                "accepted format", json_schema_extra=MASK_COUNT)]
BINARY = {"schema": {"type": "string", "format": "binary"}}
SSE_EVENT = {  # one event of /stylize/stream (OpenAPI 3.2's `itemSchema`: a generator that reads 3.1 gets the text)
    "type": "object", "required": ["event", "data"],
    "properties": {"event": {"type": "string", "enum": ["preview", "result", "error"]},
                   "data": {"type": "string", "contentMediaType": "application/json",
                            "description": "preview: {scale, num_scales, patch_num, images (base64 PNG)}; result: "
                                           "the JSON answer of /stylize; error: {error, detail}"}}}
IMAGE_CONTENT = {m: BINARY for m in (*imaging.MEDIA_TYPES.values(), ZIP_MEDIA_TYPE, BYTES_MEDIA_TYPE)}
PATHS = ("/stylize", "/stylize/stream")  # the routes that take uploads (the service's upload limit)

router = APIRouter(dependencies=[Depends(require_key)])


@dataclass(frozen=True)
class StylizeUpload:
    """The form of a stylize request: its files (not read yet) and fields."""

    content: UploadFile
    styles: list[UploadFile]
    masks: list[UploadFile] | None
    request: StylizeRequest  # the form's fields as a request (stylevar.pipelines.request)


async def stylize_upload(request: Request, state: Annotated[ServiceState, Depends(get_state)], content: ContentUpload,
                         style: StyleUploads, form: Annotated[StylizeForm, Form()],
                         style_mask: MaskUploads = None) -> StylizeUpload:
    await refuse_unknown_fields(request, state)
    return StylizeUpload(content, style, style_mask, form.request())


Plan = list[tuple[str, UploadFile, int]]  # (field name, upload, long side it is decoded at) of each image


def reference_plan(styles: list[UploadFile], masks: list[UploadFile] | None, side: int) -> Plan:
    """The styles, then the masks, each decoded at `side` (they are only seen at the model's resolution)."""
    several = len(styles) > 1
    plan = [(f"style {i + 1}" if several else "style", u, side) for i, u in enumerate(styles)]
    return plan + [(f"style_mask {i + 1}" if several else "style_mask", u, side) for i, u in enumerate(masks or [])]


def decode_plan(st: ServiceState, upload: StylizeUpload) -> Plan:
    """The content (at most max_output_side: it sets the result's size), then `reference_plan`."""
    max_side = max(st.settings.max_output_side, st.runner.pipe.image_size)
    reference_side = min(max_side, max(REFERENCE_SIDE, st.runner.pipe.image_size))
    return [("content", upload.content, max_side), *reference_plan(upload.styles, upload.masks, reference_side)]


def request_pixels(plan: Plan, request: StylizeRequest, max_output_side: int,
                   max_pixels: int = DEFAULT_MAX_PIXELS) -> int:
    """The pixels a request holds in memory, from its files' headers: every image as decoded, each mask once more
    at the content's size, and each result. An unreadable header counts nothing (decoding it then fails)."""
    sizes = [imaging.upload_size(file.file) or (0, 0) for _, file, _ in plan]
    decoded = [decoded_size(size, side, max_pixels) if size[0] else size for size, (_, _, side) in zip(sizes, plan)]
    content = decoded[0]
    if request.resize == "crop":
        side = min(*content, max_output_side)
        result = side * side
    else:
        result = math.prod(capped_size(content, max_output_side)) if content[0] else 0
    masks = sum(name.startswith("style_mask") for name, _, _ in plan)
    return sum(math.prod(d) for d in decoded) + masks * math.prod(content) + request.num_samples * result


async def reserve_pixels(st: ServiceState, plan: Plan, req: StylizeRequest, request: Request) -> Reservation:
    """Hold the request's pixels (`serve.http.memory`) until its answer is sent, or 503 `memory_busy` / 413."""
    pixels = await run_in_threadpool(request_pixels, plan, req, st.settings.max_output_side, st.settings.max_pixels)
    deadline = request.state.arrived + st.settings.request_timeout_s
    with counted_refusal(st):
        reservation = await st.memory.reserve(pixels, deadline, request.is_disconnected)
    hold_until_answered(request.scope, reservation)
    return reservation


async def decode_uploads(st: ServiceState, plan: Plan) -> list[Decoded]:
    budget = imaging.PixelBudget(st.settings.max_request_pixels)
    images = []
    for name, file, side in plan:
        data = await file.read()
        try:
            images.append(await st.decoder.decode(data, max_side=side, budget=budget))
        except ImageError as e:
            raise from_coded_error(e, f"{name}: {e}") from e
    return images


def check_alphas(alphas: tuple[float, ...] | None, n_scales: int) -> None:
    if alphas is not None and len(alphas) != n_scales:
        raise ServiceError(422, "validation_error",
                           f"alphas: the model has {n_scales} scales, got {len(alphas)} values")


def check_mix(styles: list[UploadFile], masks: list[UploadFile] | None, weights: tuple[float, ...] | None) -> None:
    try:
        check_mix_counts(len(styles), None if weights is None else len(weights), None if masks is None else len(masks),
                         masks_name="style_mask")
    except ValueError as e:
        raise ServiceError(422, "validation_error", str(e)) from None


async def submit(state: ServiceState, upload: StylizeUpload, request: Request,
                 on_preview: PreviewFn | None = None) -> tuple[Job, Decoded, dict[str, str]]:
    """Check the fields, take a queue slot and the request's pixels, decode the images and queue the job with what
    is left of the deadline (counted from the request's arrival). Returns the job, the content and
    `small_image_headers`; `ClientGone` when the client leaves while waiting for memory."""
    rid = request.state.request_id
    st = require_loaded(state)
    settings, styles, masks = st.settings, upload.styles, upload.masks
    req = upload.request
    check_alphas(req.alphas, len(st.runner.pipe.config.transformer.patch_nums))
    check_mix(styles, masks, req.style_weights)
    with counted_refusal(st):
        admission = st.batcher.admit()
    with admission:
        plan = decode_plan(st, upload)
        reservation = await reserve_pixels(st, plan, req, request)
        decoded = await decode_uploads(st, plan)
        images = [d.image for d in decoded]
        n = len(styles)
        stylization = st.runner.pipe.prepare(req, images[0], images[1:1 + n], images[1 + n:] if masks else None,
                                             max_side=st.runner.max_output_side, random_seed=os_random_seed)
        left_s = settings.request_timeout_s - (time.monotonic() - request.state.arrived)
        if left_s <= 0:
            raise ServiceError(504, "deadline_exceeded", "the request took longer than the service's deadline "
                                                         "(its upload and decoding took all of it)")
        task = StylizeTask(stylization, on_preview, st.keys.scope_of(bearer_token(request.scope)))
        with counted_refusal(st):
            job = admission.submit(stylization.key, task, rows=len(stylization.seeds), timeout_s=left_s, request_id=rid)
        job.future.add_done_callback(lambda f: reservation.model_done(not f.cancelled() and f.exception() is None))
    return job, decoded[0], small_image_headers(plan, decoded)


def small_image_headers(plan: Plan, images: list[Decoded]) -> dict[str, str]:
    """X-StyleVAR-Warning where the content or a style is too small to carry much (the command line's warning)."""
    notes = [note for (name, _, _), d in zip(plan, images)
             if not name.startswith("style_mask") and (note := small_image_warning(d.image, name.split()[0]))]
    return {"X-StyleVAR-Warning": "; ".join(n.removeprefix("warning: ") for n in notes)} if notes else {}


def encode(state: ServiceState, form: StylizeRequest, images: list[Image.Image]) -> list[bytes]:
    return [imaging.encode_image(im, form.format, state.settings.png_compress_level) for im in images]


def result_json(state: ServiceState, job: Job, form: StylizeRequest, encoded: list[bytes],
                images: list[Image.Image]) -> dict:
    media = imaging.MEDIA_TYPES[form.format]
    pipe = state.runner.pipe
    return StylizeResult(
        model=pipe.config.name, seed=job.payload.seeds[0], inference_ms=inference_ms(job),
        model_size=pipe.image_size, upsample=pipe.upsampling(form.upsample).mode,
        images=[ImageOut(seed=s, media_type=media, width=im.width, height=im.height, data=imaging.to_base64(b),
                         upscale=round(upscale_factor(im.size, pipe.image_size), 3))
                for s, b, im in zip(job.payload.seeds, encoded, images)],
    ).model_dump()


def size_headers(state: ServiceState, form: StylizeRequest, result_size: tuple[int, int]) -> dict[str, str]:
    """X-Model-Size (pixels, square), X-Upscale (result long side / model size), X-Upsample (the mode used)."""
    pipe = state.runner.pipe
    return {"X-Model-Size": str(pipe.image_size), "X-Upscale": f"{upscale_factor(result_size, pipe.image_size):.3f}",
            "X-Upsample": pipe.upsampling(form.upsample).mode}


@router.post(
    "/stylize", response_class=Response,
    responses={200: {"model": StylizeResult, "content": IMAGE_CONTENT,
                     "description": "the image (several samples: a zip of images; as application/octet-stream when "
                                    "the Accept header names it), or JSON with base64 images when the Accept header "
                                    "names application/json",
                     "headers": response_headers("X-Seed", "X-Inference-Ms", "X-Model", "X-Model-Size", "X-Upscale",
                                                 "X-Upsample", "Vary",
                                                 optional=("X-Content-Shrunk", "X-Size-Capped", "X-StyleVAR-Warning",
                                                           "Content-Disposition"))},
               **ERROR_RESPONSES},
)
async def stylize(request: Request, upload: Annotated[StylizeUpload, Depends(stylize_upload)],
                  state: Annotated[ServiceState, Depends(get_state)]) -> Response:
    """Re-draw `content` in the style of `style` (several `style` files: a blend by `style_weights`, each
    confined to its `style_mask` when masks are given)."""
    form = upload.request
    media = imaging.MEDIA_TYPES[form.format]
    representation = negotiate(request, media, form.num_samples)
    try:
        job, content, warning = await submit(state, upload, request)
        images = await wait_for_job(job, request)
    except ClientGone:
        log.info("client went away; job dropped")
        return Response(status_code=499)
    encoded = await run_in_threadpool(encode, state, form, images)
    headers = {"X-Seed": str(job.payload.seeds[0]), "X-Inference-Ms": f"{inference_ms(job):.1f}",
               "X-Model": header_safe(state.runner.pipe.config.name), "Vary": "Accept",
               **size_headers(state, form, images[0].size), **imaging.shrink_headers(content), **warning,
               **imaging.cap_headers(content, images[0].size, state.settings.max_output_side)}
    if representation == "json":
        return JSONResponse(result_json(state, job, form, encoded, images), headers=headers)
    if representation == "zip":
        headers["Content-Disposition"] = f'attachment; filename="stylevar-seed-{job.payload.seeds[0]}.zip"'
        archive = imaging.zip_images(encoded, job.payload.seeds, form.format)
        return Response(archive, media_type=binary_media(request, ZIP_MEDIA_TYPE), headers=headers)
    return Response(encoded[0], media_type=binary_media(request, media), headers=headers)


@router.post(
    "/stylize/stream", response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {"itemSchema": SSE_EVENT}},
                     "description": "`preview` events (one per scale, coarse to fine), then `result`",
                     "headers": response_headers("X-Seed", "X-Model", "Cache-Control", "X-Accel-Buffering",
                                                 optional=("X-Content-Shrunk", "X-Size-Capped", "X-StyleVAR-Warning"))},
               **ERROR_RESPONSES},
)
async def stylize_stream(request: Request, upload: Annotated[StylizeUpload, Depends(stylize_upload)],
                         state: Annotated[ServiceState, Depends(get_state)]) -> Response:
    """Server-Sent Events: a `preview` event per scale, then a `result` event (as the JSON of /stylize)."""
    loop = asyncio.get_running_loop()
    previews: asyncio.Queue[tuple[int, torch.Tensor]] = asyncio.Queue()

    def on_preview(k: int, previews_n3HW: torch.Tensor) -> None:  # called on the worker thread
        loop.call_soon_threadsafe(previews.put_nowait, (k, previews_n3HW))

    form = upload.request
    try:
        job, content, warning = await submit(state, upload, request, on_preview)
    except ClientGone:
        log.info("client went away while waiting for memory")
        return Response(status_code=499)
    side = state.runner.pipe.image_size
    fit = fit_of(content.image.size, side, form.resize)
    patch_nums = list(state.runner.pipe.config.transformer.patch_nums)

    def preview_event(k: int, previews_n3HW: torch.Tensor) -> str:
        shots = [unfit(tensor_to_pil(p), fit, max_side=side) for p in previews_n3HW]
        data = {"scale": k, "num_scales": len(patch_nums), "patch_num": patch_nums[k],
                "images": [imaging.to_base64(imaging.encode_image(s, "png")) for s in shots]}
        return sse("preview", data)

    async def events() -> AsyncIterator[str]:
        try:
            async for preview in follow_job(job, previews=previews):
                yield await run_in_threadpool(preview_event, *preview)
            images = job_result(job)
        except ServiceError as err:  # past the deadline, or the batch failed
            yield sse("error", {"error": err.code, "detail": err.detail})
            return
        encoded = await run_in_threadpool(encode, state, form, images)
        yield sse("result", result_json(state, job, form, encoded, images))

    max_side = state.settings.max_output_side  # the result's size, said before it is drawn
    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                      "X-Seed": str(job.payload.seeds[0]),
                                      "X-Model": header_safe(state.runner.pipe.config.name),
                                      **imaging.shrink_headers(content), **warning,
                                      **imaging.cap_headers(content, capped_size(content.image.size, max_side),
                                                            max_side)})


def sse(event: str, data: dict) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def inference_ms(job: Job) -> float:
    if job.started_at is None or job.finished_at is None:
        return 0.0
    return (job.finished_at - job.started_at) * 1000.0


def header_safe(text: str) -> str:
    return "".join(c if 32 <= ord(c) < 127 else "?" for c in text)
