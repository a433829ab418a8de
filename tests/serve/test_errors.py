"""One coded-error base: every family with a `code` derives from `CodedError`, every code has its HTTP status,
and a coded error that leaves a route is answered by it."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from serve.engine import batching
from serve.http import errors
from stylevar.loaders import preflight, weights
from stylevar.processing import images, video
from stylevar.utils.errors import CodedError
from web import client

FAMILIES = (images.ImageError, video.VideoError, batching.BatchError, errors.ServiceError, client.ServiceError,
            preflight.InputError, weights.MissingWeightError)


def _codes(family: type) -> set[str]:
    return {family.code} | {c for sub in family.__subclasses__() for c in _codes(sub)}


def test_every_family_has_the_one_base_and_its_other_base():
    assert all(issubclass(f, CodedError) for f in FAMILIES)
    assert issubclass(images.ImageError, ValueError) and issubclass(weights.MissingWeightError, FileNotFoundError)
    assert CodedError("x", code="on_the_spot").code == "on_the_spot" and CodedError("x").code == "error"


def test_every_served_code_has_its_status():
    served = _codes(images.ImageError) | _codes(video.VideoError) | (_codes(batching.BatchError) - {"batch_error"})
    assert served <= set(errors.ERROR_STATUS), served - set(errors.ERROR_STATUS)


def test_a_coded_error_leaving_a_route_is_answered_by_its_code():
    app = FastAPI()
    errors.install_error_handlers(app)

    @app.get("/image")
    def image():
        raise images.ImageTooLargeError("content: 9000x9000 is over the limit")

    @app.get("/queue")
    def queue():
        raise batching.QueueFullError("the queue is full", retry_after_s=4)

    @app.get("/service")
    def service():
        raise errors.ServiceError(401, "unauthorized", "missing API key")

    http = TestClient(app)
    r = http.get("/image")
    assert (r.status_code, r.json()) == (413, {"error": "image_too_large",
                                               "detail": "content: 9000x9000 is over the limit"})
    r = http.get("/queue")
    assert (r.status_code, r.json()["error"], r.headers["retry-after"]) == (503, "queue_full", "4")
    assert http.get("/service").json() == {"error": "unauthorized", "detail": "missing API key"}
