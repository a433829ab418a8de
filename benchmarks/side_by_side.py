"""What the side-by-side CPU benchmarks share: the reference-shaped configuration, seeded random inputs, a
timer in which implementations take turns call by call, and the common timing options.

`benchmarks.cpu_pipeline` (this project's stages) and `benchmarks.reference_pipeline` (the public reference)
both stand on this module, so neither imports the other at module level. Importing it does not import torch
(the scripts' --help reads `timing_arguments`).
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from stylevar.config import StyleVARConfig, VQVAEConfig

if TYPE_CHECKING:
    import torch

# the configuration in the reference's own config.json fields (as in its golden_small config, at 160 px)
REFERENCE_CONFIG = {"patch_nums": [1, 2, 3, 4, 5, 6, 8, 10], "V": 4096, "Cvae": 32, "ch": 32, "share_quant_resi": 4,
                    "depth": 8, "attn_l2_norm": True}


def reference_shaped() -> tuple[VQVAEConfig, StyleVARConfig]:
    """The reference-shaped configuration: 160 px, 8 scales up to 10 x 10, V 4096, depth 8."""
    vq = VQVAEConfig.from_reference(REFERENCE_CONFIG)
    assert vq.image_size == 160
    return vq, StyleVARConfig.from_reference(REFERENCE_CONFIG)


def reference_weights(vqvae_sd: dict, stylevar_sd: dict):
    """This project's reference-shaped StyleVAR loaded from the reference's state dicts through its own checkpoint
    loaders (`stylevar.loaders.convert`): the same weights as the reference's models."""
    from stylevar.loaders.convert import load_stylevar, load_vqvae

    vq_cfg, tr_cfg = reference_shaped()
    return load_stylevar(stylevar_sd, tr_cfg, load_vqvae(vqvae_sd, vq_cfg))


def images(batch: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded random content and style batches, (B, 3, size, size) in [-1, 1]."""
    import torch

    g = torch.Generator().manual_seed(seed)
    content = torch.rand(batch, 3, size, size, generator=g) * 2 - 1
    style = torch.rand(batch, 3, size, size, generator=g) * 2 - 1
    return content, style


# the stages of one image-to-image call, in the order they are timed (benchmarks.cpu_pipeline's doc says what each is)
STAGES = ("encode", "encoders", "condition", "loop", "decode", "total")


def take_turns(fns: dict[str, Callable[[], object]], repeats: int, warmup: int,
               clocks: Sequence[Callable[[], float]] = (time.perf_counter,)) -> dict[str, list[float]]:
    """Median seconds of each function's calls on each clock (one entry per clock), the functions taking
    turns call by call after ``warmup`` untimed rounds."""
    times: dict[str, list[list[float]]] = {name: [[] for _ in clocks] for name in fns}
    for r in range(warmup + repeats):
        for name, fn in fns.items():
            t0 = [clock() for clock in clocks]
            fn()
            if r >= warmup:
                for per_clock, clock, start in zip(times[name], clocks, t0):
                    per_clock.append(clock() - start)
    return {name: [statistics.median(t) for t in per_clock] for name, per_clock in times.items()}


def time_turns(fns: dict[str, dict[str, Callable[[], object]]], batch: int, repeats: int, warmup: int,
               stages: Sequence[str] = STAGES) -> dict[str, dict[str, float]]:
    """Median ms per image of each implementation's calls of each stage (in ``stages`` order; an
    implementation without a stage skips it), the implementations taking turns call by call, after ``warmup``
    untimed rounds."""
    out: dict[str, dict[str, float]] = {name: {} for name in fns}
    for stage in stages:
        medians = take_turns({name: f[stage] for name, f in fns.items() if stage in f}, repeats, warmup)
        for name, (seconds,) in medians.items():
            out[name][stage] = 1000 * seconds / batch
    return out


def timing_arguments(p: argparse.ArgumentParser, repeats: int, warmup: int) -> None:
    """The options every CPU timing script here shares: batch sizes, repeats, warm-up calls, threads."""
    p.add_argument("--batch-sizes", default="1,4", help="images per call, comma-separated: one measurement each")
    p.add_argument("--repeats", type=int, default=repeats, help="timed calls per stage (their median is reported)")
    p.add_argument("--warmup", type=int, default=warmup, help="untimed rounds before the timed ones")
    p.add_argument("--threads", type=int, default=2, help="torch's CPU threads")
