"""Scoring a method batch by batch: each batch generated and timed, its images scored per sample."""
from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from stylevar.runtime.bench import sync

T = TypeVar("T")


def device_name(device: torch.device) -> str:
    """Where the times were taken, for the notes of results.md."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, CUDA synchronised"
    return f"CPU, {torch.get_num_threads()} threads"


def timed(fn: Callable[[], T], device: torch.device) -> tuple[T, float]:
    """``fn()`` without autograd, and its seconds (CUDA synchronised before and after)."""
    sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = fn()
    sync(device)
    return out, time.perf_counter() - t0


@dataclass
class Scored:
    """One method over some samples, batch by batch: each sample's scores and seconds, in the order scored."""

    positions: list[int] = field(default_factory=list)  # the samples' places in their list
    scores: dict[str, list[torch.Tensor]] = field(default_factory=dict)  # metric -> per batch, (b,)
    seconds: list[float] = field(default_factory=list)  # per sample: its batch's seconds / the batch size
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)  # position -> output (CPU), those < keep

    def metric(self, name: str) -> torch.Tensor:
        """Every sample's value of one metric, (n,)."""
        return torch.cat(self.scores[name])

    def records(self) -> list[dict[str, float]]:
        """One {metric: value} per sample."""
        values = {k: self.metric(k).tolist() for k in self.scores}
        return [{k: v[j] for k, v in values.items()} for j in range(len(self.positions))]


def batch_slices(n: int, batch_size: int) -> list[slice]:
    """Positions 0 .. n-1 in batches of ``batch_size`` (the last one shorter)."""
    return [slice(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]


def score_batches(batches: Iterable[slice], generate: Callable[[slice], torch.Tensor],
                  score: Callable[[torch.Tensor, slice], dict[str, torch.Tensor]], device: torch.device,
                  keep: int = 0, on_batch: Callable[[], None] | None = None) -> Scored:
    """For each batch of sample positions: ``generate(sl)`` timed (`timed`), its images (B, 3, H, W) clamped
    to [0, 1] and scored by ``score(images, sl)`` ({metric: (B,)}); the outputs at positions < ``keep`` kept."""
    result = Scored()
    for sl in batches:
        gen, dt = timed(functools.partial(generate, sl), device)
        gen = gen.float().clamp(0, 1)
        for k, v in score(gen, sl).items():
            result.scores.setdefault(k, []).append(v.detach().float().cpu())
        positions = list(range(sl.start, sl.start + gen.shape[0]))
        result.positions += positions
        result.seconds += [dt / gen.shape[0]] * gen.shape[0]
        result.outputs.update({p: gen[j].cpu() for j, p in enumerate(positions) if p < keep})
        if on_batch is not None:
            on_batch()
    return result
