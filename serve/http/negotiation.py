"""What `/stylize` answers, from the request's Accept header (parsed by werkzeug; docs/serving.md, "Response format").
"""
from __future__ import annotations

from typing import Literal

from starlette.requests import Request
from werkzeug.datastructures import MIMEAccept
from werkzeug.http import parse_accept_header, parse_options_header

from serve.http.errors import ServiceError

JSON_MEDIA_TYPE = "application/json"
ZIP_MEDIA_TYPE = "application/zip"
BYTES_MEDIA_TYPE = "application/octet-stream"  # any binary answer, as bytes: what a generated client asks for
Representation = Literal["image", "json", "zip"]


def accepted(request: Request) -> MIMEAccept:
    """The Accept header's media ranges without their parameters; a missing header accepts anything."""
    ranges = parse_accept_header(request.headers.get("accept") or "*/*")
    return MIMEAccept((parse_options_header(media)[0], q) for media, q in ranges)


def named(accepts: MIMEAccept) -> MIMEAccept:
    """The media types the Accept header names, without its wildcards."""
    return MIMEAccept((media, q) for media, q in accepts if "*" not in media)


def negotiate(request: Request, media_type: str, num_samples: int) -> Representation:
    """JSON only when the client names `application/json` (a wildcard never selects it); otherwise the image
    (`media_type`), or a zip of several samples. The highest q wins; a tie goes to JSON."""
    accepts = accepted(request)
    explicit = named(accepts)
    as_bytes = explicit.quality(BYTES_MEDIA_TYPE)
    offers: dict[Representation, float] = {
        "json": explicit.quality(JSON_MEDIA_TYPE),
        "image": max(accepts.quality(media_type), as_bytes) if num_samples == 1 else 0.0,
        "zip": max(accepts.quality(ZIP_MEDIA_TYPE), as_bytes) if num_samples > 1 else 0.0,
    }
    best = max(offers, key=lambda name: offers[name])  # dict order breaks ties: json first
    if offers[best] > 0:
        return best
    produced = media_type if num_samples == 1 else f"{ZIP_MEDIA_TYPE} (several samples)"
    raise ServiceError(406, "not_acceptable", f"this request returns {produced} or {JSON_MEDIA_TYPE}")


def binary_media(request: Request, media_type: str) -> str:
    """`application/octet-stream` when the client names it over `media_type`, else `media_type`."""
    accepts = accepted(request)
    return BYTES_MEDIA_TYPE if named(accepts).quality(BYTES_MEDIA_TYPE) > accepts.quality(media_type) else media_type
