"""Service settings: every field can be set from the environment as `STYLEVAR_<FIELD>`.

Lists (`STYLEVAR_API_KEYS`, `STYLEVAR_CORS_ORIGINS`, `STYLEVAR_DEVICE`) are comma-separated.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from stylevar.utils.precision import REMOVED_PRECISIONS, precision_error  # no torch
from stylevar.utils.heap import DEFAULT_KEEP_MB, MAX_KEEP_MB  # no torch either
from stylevar.utils.threads import THREADS_ENV, parse_threads  # no torch either

MAX_BATCH_LIMIT = 256  # the most STYLEVAR_MAX_BATCH_SIZE takes, and the largest batch the memory sizing picks
RENAMED_THREADS = "STYLEVAR_TORCH_THREADS"  # the setting's name before STYLEVAR_THREADS: refused, naming the new one


def demo_model_dir() -> Path:
    """The embedded demo model, `stylevar.loaders.model_dir.DEMO_MODEL_DIR` (imported when first asked for: it loads torch)."""
    from stylevar.loaders.model_dir import DEMO_MODEL_DIR
    return DEMO_MODEL_DIR


def env_name(field: str) -> str:
    """The environment variable of a setting: ``model_dir`` -> ``STYLEVAR_MODEL_DIR``."""
    return f"{ServeSettings.model_config['env_prefix']}{field.upper()}"


class ServeSettings(BaseSettings):
    """Configuration of one service process. Defaults suit a single-GPU or CPU deployment."""

    model_config = SettingsConfigDict(env_prefix="STYLEVAR_", extra="ignore", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    model_dir: Path = Field(default_factory=demo_model_dir)
    # "auto": every visible CUDA device, else the CPU; or a list such as "cuda:0,cuda:1"
    device: Annotated[list[str], NoDecode] = ["auto"]
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # torch's CPU threads: a count, "torch" (torch's own choice) or "auto"/0/None (stylevar.utils.threads)
    threads: int | Literal["torch"] | None = None
    # "fp32" the model's own weights (a seed's picture the same on every machine), "bf16" bfloat16 parts, "auto" bf16
    # where this CPU's bf16 products measure faster at load, else fp32 (stylevar.runtime.inference.choose_precision)
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    # MiB of freed heap kept for the next request (stylevar.utils.heap; glibc only); 0: the C library's thresholds
    heap_keep_mb: int = Field(DEFAULT_KEEP_MB, ge=0, le=MAX_KEEP_MB)
    compile: bool = False  # torch.compile the transformer blocks; compiled at warm-up, before /readyz is 200
    condition_cache_mb: float = Field(256.0, ge=0)  # LRU cache of style/content conditions; 0: off

    # batching
    # rows (samples) per generate call; None: what the device's memory holds (serve.engine.sizing; 8 on the CPU)
    max_batch_size: int | None = Field(None, ge=1, le=MAX_BATCH_LIMIT)
    max_wait_ms: float = Field(10.0, ge=0, le=10_000)
    queue_size: int = Field(64, ge=1)  # jobs waiting for a worker
    # a request whose estimated wait is longer gets 503 with Retry-After; 0: no bound (only the queue size)
    max_queue_wait_s: float = Field(20.0, ge=0)
    worker_nice: int = Field(10, ge=0, le=19)  # the batch workers' CPU priority below the event loop's
    gc_freeze: bool = True  # after warm-up, gc.freeze what startup allocated
    request_timeout_s: float = Field(60.0, gt=0)
    # after SIGTERM/SIGINT: how long requests in flight may take to finish (serve.http.drain)
    drain_timeout_s: float = Field(30.0, gt=0, le=3600)

    # input limits
    max_upload_bytes: int = Field(20 * 1024 * 1024, ge=1024)  # whole request body
    body_timeout_s: float = Field(15.0, gt=0, le=600)  # an upload's longest stall between two parts (408)
    max_pixels: int = Field(40_000_000, ge=1)  # per input image, checked before decoding
    # all the images of one request together, from their headers before decoding (413)
    max_request_pixels: int = Field(120_000_000, ge=1)
    # WebP and 16-bit or interlaced PNG cannot be decoded downscaled (JPEG and 8-bit PNG are): their own limit
    max_whole_decode_pixels: int = Field(4_194_304, ge=1)
    decode_concurrency: int = Field(2, ge=1, le=64)  # uploads decoded at once (worker threads)
    # long side of a returned image; the content is decoded at most this large
    max_output_side: int = Field(8192, ge=16)
    png_compress_level: int = Field(1, ge=0, le=9)  # zlib level of returned PNGs (same pixels at any level)
    # pixels of full-size images in memory at once, all requests together (serve.http.memory); 0: no bound
    max_pixels_in_flight: int = Field(128_000_000, ge=0)
    # a client that reads less than 16 KiB of its waiting answer in this long is disconnected (serve.http.connections)
    send_timeout_s: float = Field(10.0, gt=0, le=600)
    # open connections, in all and from one client address; one over either gets 503. 0: no limit
    max_connections: int = Field(512, ge=0)
    max_connections_per_client: int = Field(32, ge=0)

    # POST /stylize/video: short clips, checked from the clip's header and again while decoding
    max_video_upload_bytes: int = Field(64 * 1024 * 1024, ge=1024)  # the clip and its style images together
    max_video_duration_s: float = Field(10.0, gt=0)
    max_video_frames: int = Field(300, ge=1)
    max_video_pixels: int = Field(1280 * 720, ge=1)  # per frame
    video_concurrency: int = Field(1, ge=1, le=16)  # clips stylized at once (beside the image batches)
    video_timeout_s: float = Field(300.0, gt=0)  # a clip still running then is stopped (504)

    # access and observability
    api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list, repr=False)
    # comma-separated reverse proxies whose X-Forwarded-For / -Proto are believed ("*": any; empty: none)
    forwarded_allow_ips: str = ""
    # wrong API keys (or UI passwords) from one client within the window before it gets 429; 0: no limit
    auth_max_failures: int = Field(10, ge=0)
    auth_failure_window_s: float = Field(300.0, gt=0)
    # a form field a route does not declare (a misspelt option) is refused (422, naming the nearest field); true: ignored
    allow_unknown_fields: bool = False
    docs: bool = True  # /docs, /redoc and /openapi.json (their scripts served by the service itself: no CDN)
    # /metrics: "public" (no key), "key" (the API key when keys are set, like the API) or "off"
    metrics_access: Literal["public", "key", "off"] = "public"
    cors_origins: Annotated[list[str], NoDecode] = []
    warmup: bool = True
    log_json: bool = True
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    ui: bool = True

    @field_validator("device", "api_keys", "cors_origins", mode="before")
    @classmethod
    def _lists_from_commas(cls, value: object) -> object:
        return [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else value

    @field_validator("threads", mode="before")
    @classmethod
    def _threads_as_the_library_takes_them(cls, value: object) -> object:
        return parse_threads(value)  # type: ignore[arg-type]  # a ValueError says what is taken

    @model_validator(mode="before")
    @classmethod
    def _renamed_setting_says_so(cls, data: object) -> object:
        if os.environ.get(RENAMED_THREADS, "").strip():
            raise ValueError(f"{RENAMED_THREADS} was renamed {THREADS_ENV} (a count, 'torch' or 'auto', the default: "
                             "docs/serving.md#threads); set that instead")
        return data

    @field_validator("precision", mode="before")
    @classmethod
    def _removed_precision_says_why(cls, value: object) -> object:
        if isinstance(value, str) and value in REMOVED_PRECISIONS:
            raise ValueError(precision_error(value))
        return value

    @field_validator("device")
    @classmethod
    def _devices_not_empty(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("device must name at least one device, or 'auto'")
        return value
