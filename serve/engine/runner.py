"""The model side of the service: loading a pipeline per device and running batches of jobs on it."""
from __future__ import annotations

import functools

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from stylevar.utils.heap import DEFAULT_KEEP_MB, apply_heap_policy
from stylevar.utils.precision import resolve_autocast_dtype, set_matmul_precision
from stylevar.utils.threads import decision
from stylevar.runtime.compile import WARM_BATCHES, compiled
from stylevar.runtime.inference import InferenceConfig, PrecisionChoice, precision_of, prepare_for_serving
from stylevar.pipelines.conditions import CacheObserver, ConditionCache
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.pipelines.request import Stylization, StylizeRequest

from serve.engine.batching import Job

log = logging.getLogger("serve.engine.runner")

PreviewFn = Callable[[int, torch.Tensor], None]  # (scale index k, previews (n, 3, S, S) in [0, 1] on the CPU)


@dataclass
class StylizeTask:
    """One resolved request (`StylePipeline.prepare`): its stylization (one row per seed) and where its previews go."""

    stylization: Stylization
    on_preview: PreviewFn | None = None
    cache_scope: str = ""  # whose entries of the condition cache its reference images are (StylePipeline.condition)

    @property
    def seeds(self) -> tuple[int, ...]:
        return self.stylization.seeds


@dataclass(frozen=True)
class RunnerOptions:
    """How a runner loads and runs its model (from `ServeSettings`)."""

    dtype: str = "auto"
    max_output_side: int = 1024
    inference: InferenceConfig = InferenceConfig()
    condition_cache_bytes: int = 0  # 0: nothing kept across batches
    threads: int | str | None = None  # torch's CPU threads (StylePipeline.from_pretrained; None: the policy)
    heap_keep_mb: int = DEFAULT_KEEP_MB  # freed memory the process's heap keeps (stylevar.utils.heap)

    @classmethod
    def from_settings(cls, settings) -> "RunnerOptions":
        return cls(dtype=settings.dtype, max_output_side=settings.max_output_side,
                   inference=InferenceConfig(precision=settings.precision, compile=settings.compile),
                   condition_cache_bytes=int(settings.condition_cache_mb * 2**20), threads=settings.threads,
                   heap_keep_mb=settings.heap_keep_mb)


class ModelRunner:
    """A pipeline on one device. `run` is the batcher's run function for that device. Conditions of the
    reference images come through the pipeline's `ConditionCache` (``cache`` when given), each row in its key's scope."""

    def __init__(self, pipe: StylePipeline, max_output_side: int, cache: ConditionCache | None = None):
        self.pipe = pipe
        self.max_output_side = max_output_side
        if cache is not None:
            pipe.conditions = cache

    @property
    def cache(self) -> ConditionCache:
        return self.pipe.conditions

    @classmethod
    def load(cls, model_dir: Path, device: torch.device, options: RunnerOptions = RunnerOptions(),
             observer: CacheObserver | None = None) -> "ModelRunner":
        t0 = time.perf_counter()
        set_matmul_precision()  # TF32 on CUDA: however the service starts (python -m serve, an ASGI server)
        heap = apply_heap_policy(keep=options.heap_keep_mb)  # before the load's own (the first decides)
        pipe = StylePipeline.from_pretrained(model_dir, device=device, threads=options.threads,
                                             autocast_dtype=resolve_autocast_dtype(options.dtype, device))
        inference = options.inference
        prepare_for_serving(pipe.model, inference)  # the precision settled; CPU layouts and packing, compile asked for
        chosen, precision = decision(), precision_of(pipe.model)  # what decided the process's threads, the precision
        log.info("model loaded", extra={"model_dir": str(model_dir), "device": str(device),
                                        "precision": precision.precision, "precision_reason": precision.reason,
                                        "compile": inference.compile,
                                        "threads": torch.get_num_threads(), "threads_by": chosen and chosen.source,
                                        "heap_keep_mb": heap.keep_mb, "heap_by": heap.source,
                                        "seconds": round(time.perf_counter() - t0, 3)})
        return cls(pipe, options.max_output_side, ConditionCache(options.condition_cache_bytes, observer))

    @property
    def device(self) -> torch.device:
        return self.pipe.device

    @property
    def precision(self) -> PrecisionChoice:
        """The precision the model runs in, and why (`stylevar.runtime.inference.precision_of`)."""
        return precision_of(self.pipe.model)

    @property
    def dtype_name(self) -> str:
        dt = self.pipe.model.autocast_dtype
        return "float32" if dt is None else str(dt).removeprefix("torch.")

    def run(self, jobs: Sequence[Job]) -> list[list[Image.Image]]:
        """All jobs share one batch key (`Stylization.key`); returns each job's images, one per seed."""
        tasks: list[StylizeTask] = [j.payload for j in jobs]
        on_scale = self._preview_router(tasks) if any(t.on_preview for t in tasks) else None
        scopes = [t.cache_scope for t in tasks for _ in t.seeds]
        with torch.inference_mode():
            return self.pipe.run([t.stylization for t in tasks], on_scale=on_scale,
                                 condition=functools.partial(self.pipe.condition, scopes=scopes))

    @staticmethod
    def _preview_router(tasks: list[StylizeTask]) -> Callable[[int, torch.Tensor], None]:
        def on_scale(k: int, previews_B3HW: torch.Tensor) -> None:
            cpu = previews_B3HW.detach().float().cpu()
            start = 0
            for t in tasks:
                n = len(t.seeds)
                if t.on_preview is not None:
                    t.on_preview(k, cpu[start:start + n])
                start += n
        return on_scale

    def warmup(self) -> float:
        """Small generate calls through the requests' path before /readyz says ready (with compiled blocks, one per
        `WARM_BATCHES` size, so that no request compiles a graph). Returns the seconds."""
        t0 = time.perf_counter()
        img = Image.new("RGB", (self.pipe.image_size, self.pipe.image_size), (128, 96, 64))
        cfg = self.pipe.config.transformer
        stylization = self.pipe.prepare(StylizeRequest(seed=0), img, img, max_side=self.max_output_side)
        count = compiled(self.pipe.model)
        for rows in WARM_BATCHES if count is not None else (1,):
            self.run([Job(key=stylization.key, rows=1, payload=StylizeTask(stylization), deadline=float("inf"))
                      for _ in range(rows)])
        log.info("warm-up done", extra={"device": str(self.device), "scales": len(cfg.patch_nums),
                                        "graphs": None if count is None else count.graphs,
                                        "seconds": round(time.perf_counter() - t0, 3)})
        return time.perf_counter() - t0
