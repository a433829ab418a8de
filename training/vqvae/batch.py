"""``--batch-size auto``: the largest power-of-two batch whose training step fits the GPU's free memory, from the
peak memory of one step of the run's own objective at two batch sizes. A resumed run keeps RUN's batch."""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch

from stylevar.config import VQVAEConfig
from training.parts.distributed import DistEnv, all_reduce_max, broadcast_object
from stylevar.utils.precision import autocast, resolve_precision
from training.vqvae.objective import build_objective

MEMORY_SHARE = 0.85  # of the free memory that the chosen batch may use (the rest: fragmentation, cuDNN workspaces)
MEASURED = (8, 16)  # the batches whose peak memory draws the line


def batch_to_fill(peak_bytes: dict[int, int], budget_bytes: float, largest: int = 1024) -> int:
    """The largest power-of-two batch whose peak memory, on the line through two measured (batch, peak bytes)
    points, stays within ``budget_bytes``; at least the smaller measured batch."""
    (b0, m0), (b1, m1) = sorted(peak_bytes.items())
    per_image = max((m1 - m0) / (b1 - b0), 1.0)
    best, b = b0, b0
    while b <= largest:
        if m0 + (b - b0) * per_image <= budget_bytes:
            best = b
        b *= 2
    return best


def training_step(args: argparse.Namespace, vq_cfg: VQVAEConfig, env: DistEnv) -> Callable[[int], float]:
    """One step of the run's objective (its losses, precision and memory layout) on random images, as a function of
    the batch that returns the loss: what :func:`measured_batch` measures, runnable on the CPU."""
    objective, _ = build_objective(args, vq_cfg, env)
    precision = resolve_precision(args.precision, env.device)
    side = vq_cfg.image_size
    layout = torch.channels_last if args.channels_last else torch.contiguous_format

    def step(batch: int) -> float:
        images = torch.rand(batch, 3, side, side, device=env.device).mul(2).sub(1)
        with autocast(precision, env.device):
            loss, _ = objective({"image": images.contiguous(memory_format=layout)})
        loss.backward()
        objective.zero_grad(set_to_none=True)
        return loss.item()

    return step


def measured_batch(args: argparse.Namespace, vq_cfg: VQVAEConfig, env: DistEnv) -> int:
    """:func:`batch_to_fill` of this process's GPU, from the peak memory of a step at each of MEASURED."""
    free, _ = torch.cuda.mem_get_info(env.device)
    budget = MEMORY_SHARE * (free + torch.cuda.memory_allocated(env.device))
    step = training_step(args, vq_cfg, env)
    peaks = {}
    for b in MEASURED:
        torch.cuda.reset_peak_memory_stats(env.device)
        step(b)
        peaks[b] = torch.cuda.max_memory_allocated(env.device)
    del step  # the objective with it
    torch.cuda.empty_cache()
    return batch_to_fill(peaks, budget)


def resolve_batch(args: argparse.Namespace, vq_cfg: VQVAEConfig, env: DistEnv) -> tuple[int, str]:
    """The global batch of ``--batch-size auto`` and a log line: RUN's on a resume, else the measured one."""
    config = Path(args.out) / "config.json"
    saved = broadcast_object(json.loads(config.read_text())["batch_size"] if config.is_file() else None, env)
    if saved is not None:
        return int(saved), f"--batch-size auto: {saved}, the run's"
    if env.device.type != "cuda":
        raise SystemExit("error: --batch-size auto measures a CUDA device's memory; give a number on the CPU")
    per_process = int(-all_reduce_max(-float(measured_batch(args, vq_cfg, env)), env))
    batch = per_process * env.world_size * args.grad_accum
    return batch, f"--batch-size auto: {batch} ({per_process} a step on each of {env.world_size} processes)"
