"""Errors of the HTTP API: every one is answered as `{"error": code, "detail": detail}` (`ErrorBody`).

`install_error_handlers(app)` gives FastAPI's own errors and every `CodedError` that body; `ERROR_STATUS` maps a
code to its HTTP status; `ERROR_RESPONSES` documents them in the OpenAPI schema.
"""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve.engine.batching import OverloadedError, QueueFullError, StoppedError
from serve.http.openapi import referenced
from serve.http.schemas import ErrorBody, response_headers
from stylevar.utils.errors import CodedError, unknown_name

IMAGE_ERROR_STATUS = {"not_an_image": 415, "corrupt_image": 422, "image_too_large": 413, "image_too_costly": 422,
                      "bad_image": 422}
BATCH_ERROR_STATUS = {"queue_full": 503, "memory_busy": 503, "out_of_memory": 503, "shutting_down": 503,
                      "deadline_exceeded": 504, "inference_failed": 500}
VIDEO_ERROR_STATUS = {"not_a_video": 415, "unsupported_codec": 415, "corrupt_video": 422, "video_too_long": 413,
                      "video_too_large": 413, "bad_video": 422}
ERROR_STATUS = {**IMAGE_ERROR_STATUS, **VIDEO_ERROR_STATUS, **BATCH_ERROR_STATUS}  # any other code: 500
HTTP_ERROR_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
                    405: "method_not_allowed", 406: "not_acceptable", 413: "payload_too_large",
                    415: "unsupported_media_type", 422: "validation_error", 429: "too_many_attempts",
                    503: "unavailable"}

UNION_TAGS = {"int", "float", "str", "bool"}  # what pydantic appends to a field's name for each type it tried
RETRY_STATUSES = (429, 503)  # the answers that may say when to try again
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text,
             **({"headers": response_headers(optional=("Retry-After",))} if status in RETRY_STATUSES else {})}
    for status, text in {
        401: "missing or wrong API key", 429: "too many wrong API keys from this client (see Retry-After)",
        406: "the requested media type cannot be produced",
        413: "upload too large (bytes or pixels)", 415: "not a JPEG, PNG or WebP image",
        422: "invalid field or corrupt image", 503: "queue full, memory busy or not ready (see Retry-After)",
        504: "deadline exceeded",
    }.items()
}


UPLOAD_LIMIT_KEY = "serve.upload_limit"  # in a request's scope: (bytes, setting) of its route's upload limit


def upload_too_large(limit: int, setting: str, size: int | None = None) -> JSONResponse:
    """The 413 of a request body over ``limit`` bytes (``size``: what it declared), naming ``setting``."""
    body = "request body" if size is None else f"request body of {size} bytes"
    return error_response(413, "payload_too_large", f"{body} is over the limit of {limit} bytes "
                          f"({limit / 2**20:.4g} MiB), which the service's {setting} sets", {"Connection": "close"})


class ServiceError(CodedError):
    """An error answered as `{"error": code, "detail": detail}` with `status`."""

    def __init__(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None):
        super().__init__(detail, code=code)
        self.status, self.detail, self.headers = status, detail, headers or {}


class ClientGone(Exception):
    """The client disconnected while its job waited."""


def error_response(status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status, headers=headers)


def from_coded_error(e: CodedError, detail: str | None = None) -> ServiceError:
    """Any coded error's answer: its code's `ERROR_STATUS` (else 422 for a ValueError, 500 for others), `detail`
    (default: its message), Retry-After where trying again may work."""
    if isinstance(e, ServiceError):
        return e
    headers = {}
    if isinstance(e, QueueFullError):
        headers["Retry-After"] = str(e.retry_after_s)
    elif isinstance(e, (OverloadedError, StoppedError)):
        headers["Retry-After"] = "1"
    default = 422 if isinstance(e, ValueError) else 500  # an input refused (ImageError, VideoError), else a failure
    return ServiceError(ERROR_STATUS.get(e.code, default), e.code, str(e) if detail is None else detail, headers)


async def coded_error_handler(request: Request, exc: CodedError) -> JSONResponse:
    """A `ServiceError` as it says; any other coded error that leaves a route by `from_coded_error`."""
    answer = from_coded_error(exc)
    return error_response(answer.status, answer.code, answer.detail, answer.headers)


async def http_error_handler(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 413 and UPLOAD_LIMIT_KEY in request.scope:  # a streamed body over its route's limit
        return upload_too_large(*request.scope[UPLOAD_LIMIT_KEY])
    code = HTTP_ERROR_CODES.get(exc.status_code, f"http_{exc.status_code}")
    return error_response(exc.status_code, code, route_hint(request, exc), getattr(exc, "headers", None))


def route_hint(request: Request, exc: StarletteHTTPException) -> str:
    """A wrong path names the nearest route, a wrong method the right ones; a route's own errors keep their detail."""
    path, allowed = request.url.path, (getattr(exc, "headers", None) or {}).get("Allow")
    if exc.status_code == 404 and "route" not in request.scope:
        routes = {*request.app.openapi().get("paths", {}), *(getattr(r, "path", "") for r in request.app.routes)} - {""}
        return f"{unknown_name('path', path, routes)} (the API's operations are listed at /docs)"
    if exc.status_code == 405 and allowed:
        return f"{request.method} is not allowed on {path}; use {allowed} (see /docs)"
    return str(exc.detail)


def form_fields(request: Request) -> set[str]:
    """The multipart fields the request's route declares, read from the app's OpenAPI document (built once, each
    form one plain object: `serve.http.openapi`)."""
    route = request.scope.get("route")
    spec = request.app.openapi()
    operation = spec.get("paths", {}).get(getattr(route, "path", None), {}).get(request.method.lower(), {})
    body = operation.get("requestBody", {}).get("content", {}).get("multipart/form-data", {}).get("schema", {})
    return set(referenced(spec.get("components", {}).get("schemas", {}), body).get("properties", {}))


def field_hints(known: set[str], body: Any) -> list[str]:
    """'unknown field NAME; did you mean ...?' for each form field not among the route's ``known`` (`form_fields`)."""
    if not hasattr(body, "keys"):
        return []
    return [unknown_name("field", name, known) for name in sorted(set(body.keys()) - known)] if known else []


def error_message(err: dict[str, Any]) -> str:
    """One validation error as `field: message`, with a hint where the mistake is a common one."""
    names = [str(x) for x in err.get("loc", ()) if x != "body"]
    loc = ".".join(names[:-1] if len(names) > 1 and names[-1] in UNION_TAGS else names)  # `seed`, not `seed.int`
    msg = str(err.get("msg", "invalid"))
    if "Expected UploadFile" in msg:  # text where a file belongs: curl's -F name=path without the @
        field = loc.split(".")[0] or "content"
        msg = f"send a file, not text (curl: -F {field}=@photo.jpg)"
    return f"{loc}: {msg}" if loc else msg


async def validation_error_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
    everything = exc.errors()
    errors = [e for e in everything if e.get("type") != "none_required"] or everything  # not an optional's None
    fields, sent = form_fields(request), request.headers.get("content-type", "").split(";")[0]
    parts = field_hints(fields, exc.body) + [error_message(err) for err in errors]
    if sent != "multipart/form-data" and fields:  # JSON, a urlencoded form or nothing, where files are sent
        first = "video=@clip.mp4" if "video" in fields else "content=@photo.jpg"
        parts.insert(0, f"send multipart/form-data, not {sent or 'an empty body'} (curl -F {first} -F style=@art.jpg)")
    return error_response(422, "validation_error", "; ".join(parts) or "invalid request")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(CodedError, coded_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
