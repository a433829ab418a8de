"""HTTP client of the StyleVAR service as the UI uses it: `GET /v1/model`, `POST /stylize/stream` (Server-Sent
Events) and `POST /stylize/video`. Every failure is a `ServiceError`, whose `message` is a sentence for people.
"""
from __future__ import annotations

import base64
import io
import json
import mimetypes
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import SSEError, connect_sse
from PIL import Image

from stylevar.pipelines.options import DECLARED, FORM, IMAGE_ONLY, Option
from stylevar.pipelines.request import StylizeRequest
from stylevar.utils.errors import CodedError

ImageSource = str | os.PathLike | bytes


# an absolute file path in a message (/models/demo/config.json): a UI user is shown only its last part
_PATH = re.compile(r"(?<![\w.~:/])/(?:[^\s/:'\"(),;]+/)+([^\s/:'\"(),;]*)")


def without_paths(text: str) -> str:
    return _PATH.sub(lambda m: m.group(1) or "a folder", text)


# the service's refusals of a clip (serve.http.routes.video) and what to do about each
VIDEO_CODES = {"not_a_video": "Upload a video file (MP4, MOV, MKV, WebM, AVI ...).",
               "unsupported_codec": "Re-encode it as H.264 (or VP9 / AV1) with AAC or Opus audio.",
               "corrupt_video": "The file is damaged or incomplete; export it again.",
               "video_too_long": "Use a shorter clip here; the command line (stylevar stylize) takes long ones.",
               "video_too_large": "Use a clip of smaller frames (or the command line)."}


class ServiceError(CodedError):
    """The service refused or failed a request, or could not be reached (`status` None)."""

    def __init__(self, status: int | None, code: str, detail: str, retry_after_s: float | None = None):
        self.status, self.code, self.detail, self.retry_after_s = status, code, detail, retry_after_s
        super().__init__(self.message)

    @property
    def message(self) -> str:
        detail = without_paths(self.detail).rstrip(".")
        if self.status is None:
            return f"Cannot reach the StyleVAR service: {detail}."
        if self.status == 401:
            return "The service needs an API key (start the UI with --api-key, or set STYLEVAR_API_KEY)."
        if self.code in VIDEO_CODES:
            return f"Not a usable clip: {detail}. {VIDEO_CODES[self.code]}"
        if self.status == 413:
            return f"Upload too large: {detail}. Use a smaller image."
        if self.status == 415:
            return f"Not a supported image: {detail}. Use a JPEG, PNG or WebP file."
        if self.status == 422:
            return f"Invalid input: {detail}."
        if self.status in (429, 503):
            wait = f" in {self.retry_after_s:g} s" if self.retry_after_s else " in a moment"
            return f"The service is busy ({detail}). Please try again{wait}."
        if self.status == 504 or self.code == "deadline_exceeded":
            return "The service took too long and gave up (deadline exceeded). Try again, or ask for fewer samples."
        return f"The service failed ({self.status} {self.code}): {detail}."


def form_fields(request: StylizeRequest) -> dict[str, str]:
    return {name: encode(DECLARED[name], value) for name, value in request.given().items() if DECLARED[name].on(FORM)}


def encode(option: Option, value: Any) -> str:
    if option.type is bool:
        return "true" if value else "false"
    if option.is_list:
        return ",".join(repr(float(v)) for v in value)
    if option.number is not None:
        return repr(float(value)) if option.number is float else str(int(value))
    return str(value)


@dataclass(frozen=True)
class Preview:
    """The picture after scale `scale` (0-based) of `num_scales`: one image per sample."""

    scale: int
    num_scales: int
    patch_num: int
    images: list[Image.Image]


@dataclass(frozen=True)
class ResultImage:
    seed: int
    image: Image.Image
    data: bytes  # the encoded file as the service sent it
    media_type: str


@dataclass(frozen=True)
class Result:
    model: str
    seed: int
    inference_ms: float
    images: list[ResultImage]
    warning: str = ""  # X-StyleVAR-Warning: an input too small to carry much


def _decode_image(b64: str) -> tuple[bytes, Image.Image]:
    data = base64.b64decode(b64)
    img = Image.open(io.BytesIO(data))
    img.load()
    return data, img


def _upload(name: str, source: ImageSource) -> tuple[str, bytes, str]:
    if isinstance(source, (bytes, bytearray)):
        return f"{name}.bin", bytes(source), "application/octet-stream"
    path = Path(source)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ServiceError(422, "bad_upload", f"{name}: cannot read {path.name} ({e.strerror})") from e
    return path.name, data, mimetypes.guess_type(path.name)[0] or "application/octet-stream"


def _style_files(style: ImageSource | Sequence[ImageSource], masks: Sequence[ImageSource] | None
                 ) -> list[tuple[str, tuple[str, bytes, str]]]:
    styles = list(style) if isinstance(style, (list, tuple)) else [style]
    several = len(styles) > 1
    files = [("style", _upload(f"style{i + 1}" if several else "style", s)) for i, s in enumerate(styles)]
    return files + [("style_mask", _upload(f"mask{i + 1}", m)) for i, m in enumerate(masks or [])]


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def error_from_response(response: httpx.Response) -> ServiceError:
    try:
        body = json.loads(response.read())
        code, detail = str(body["error"]), str(body["detail"])
    except (ValueError, KeyError, TypeError):
        code = f"http_{response.status_code}"
        detail = response.reason_phrase or "unexpected response"
    return ServiceError(response.status_code, code, detail, _retry_after(response))


@dataclass(frozen=True)
class VideoResult:
    data: bytes  # the H.264 mp4
    model: str
    seed: int
    frames: int
    fps: float
    inference_ms: float
    temporal: str
    audio: bool


class ServiceClient:
    """One connection pool to the service at `base_url`; safe to share between threads."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout_s: float = 120.0,
                 transport: httpx.BaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        timeout = httpx.Timeout(timeout_s, connect=10.0)  # read: the longest silence between two stream events
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "ServiceClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unreachable(self, e: httpx.HTTPError) -> ServiceError:
        kind = "timed out" if isinstance(e, httpx.TimeoutException) else (str(e) or type(e).__name__)
        return ServiceError(None, "unreachable", f"{self.base_url}: {kind}")

    def _send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """One request answered 200, else its `ServiceError` (refused, or the service unreachable)."""
        try:
            response = self._http.request(method, url, **kwargs)
        except httpx.HTTPError as e:
            raise self._unreachable(e) from e
        if response.status_code != 200:
            raise error_from_response(response)
        return response

    def model_info(self) -> dict[str, Any]:
        return self._send("GET", "/v1/model").json()

    def stylize_stream(self, content: ImageSource, style: ImageSource | Sequence[ImageSource],
                       options: StylizeRequest = StylizeRequest(), masks: Sequence[ImageSource] | None = None,
                       ) -> Iterator[Preview | Result]:
        """`POST /stylize/stream`: a `Preview` per scale, then one `Result`; closing early drops the job."""
        files = [("content", _upload("content", content)), *_style_files(style, masks)]
        try:
            with connect_sse(self._http, "POST", "/stylize/stream", files=files, data=form_fields(options)) as source:
                if source.response.status_code != 200:
                    raise error_from_response(source.response)
                for event in source.iter_sse():
                    if event.event == "preview":
                        data = event.json()
                        images = [_decode_image(b)[1] for b in data["images"]]
                        yield Preview(data["scale"], data["num_scales"], data["patch_num"], images)
                    elif event.event == "result":
                        yield _result(event.json(), source.response.headers.get("x-stylevar-warning", ""))
                        return
                    elif event.event == "error":
                        data = event.json()
                        status = 504 if data.get("error") == "deadline_exceeded" else 503
                        raise ServiceError(status, str(data.get("error")), str(data.get("detail")))
        except httpx.HTTPError as e:
            raise self._unreachable(e) from e
        except SSEError as e:
            raise ServiceError(502, "bad_stream", f"the service did not answer with an event stream ({e})") from e
        raise ServiceError(502, "bad_stream", "the event stream ended without a result")

    def stylize_video(self, video: ImageSource, style: ImageSource | Sequence[ImageSource],
                      options: StylizeRequest = StylizeRequest(), masks: Sequence[ImageSource] | None = None,
                      temporal: str | None = None, timeout_s: float = 900.0) -> VideoResult:
        """`POST /stylize/video` (``temporal`` None: the service's default); waits up to ``timeout_s``."""
        files = [("video", _upload("video", video)), *_style_files(style, masks)]
        data = {k: v for k, v in form_fields(options).items() if k not in IMAGE_ONLY}
        if temporal is not None:
            data["temporal"] = temporal
        response = self._send("POST", "/stylize/video", files=files, data=data,
                              timeout=httpx.Timeout(timeout_s, connect=10.0))
        h = response.headers
        return VideoResult(response.content, h.get("x-model", ""), int(h.get("x-seed", 0)),
                           int(h.get("x-frames", 0)), float(h.get("x-fps", 0)), float(h.get("x-inference-ms", 0)),
                           h.get("x-temporal", ""), h.get("x-audio") == "1")


def _result(data: dict[str, Any], warning: str = "") -> Result:
    images = []
    for item in data["images"]:
        raw, img = _decode_image(item["data"])
        images.append(ResultImage(item["seed"], img, raw, item["media_type"]))
    return Result(data["model"], data["seed"], data["inference_ms"], images, warning)
