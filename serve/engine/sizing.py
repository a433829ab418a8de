"""The batcher's default maximum batch (`STYLEVAR_MAX_BATCH_SIZE` unset): what the device's memory holds.

On a GPU, the most samples whose sampling loop (`stylevar.runtime.memory`) fits in `MEMORY_FRACTION` of the memory
free after loading; on the CPU, `CPU_MAX_BATCH`; with several devices, the smallest.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from serve.settings import MAX_BATCH_LIMIT
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.runtime.memory import max_batch

CPU_MAX_BATCH = 8
# the rest of the free memory: the encoders and the tokenizer's decoder (they run before and after the loop), kernel
# workspaces and the allocator's fragmentation
MEMORY_FRACTION = 0.8


class Runner(Protocol):
    pipe: StylePipeline

    @property
    def device(self) -> torch.device: ...


def free_device_bytes(device: torch.device) -> int:
    return torch.cuda.mem_get_info(device)[0]


def device_max_batch(runner: Runner, free_bytes: Callable[[torch.device], int] = free_device_bytes) -> int:
    """The default maximum batch of one loaded runner (module doc); at least 1."""
    if runner.device.type != "cuda":
        return CPU_MAX_BATCH
    pipe = runner.pipe
    budget = int(MEMORY_FRACTION * free_bytes(runner.device))
    guided = pipe.generation_config().guidance > 0
    return max(1, max_batch(pipe.model.cfg, budget, pipe.model.loop_dtype, guidance=guided, limit=MAX_BATCH_LIMIT))


def default_max_batch(runners: Sequence[Runner], free_bytes: Callable[[torch.device], int] = free_device_bytes) -> int:
    return min(device_max_batch(r, free_bytes) for r in runners)
