"""The optimizer step of the recipes whose step is one objective (training.vqvae, training.sft), and its
log line: accumulation with DDP's no_sync, autocast, loss scaling, clipping, optimizer and scheduler."""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import torch

from training.parts.distributed import no_sync
from training.parts.log import MetricWindow
from training.parts.precision import autocast
from training.parts.run import TrainingRun
from training.parts.schedule import LoopConfig


def clip_and_step(
    params: Sequence[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    scheduler: Any,
    max_grad_norm: float | None,
    foreach: bool | None = True,
) -> float:
    """Unscale, clip (when max_grad_norm > 0), step the optimizer and scheduler, zero the grads.

    ``foreach``: the norm and the scaling of all gradients in one foreach pass (None: torch's choice, the
    for-loop on the CPU); the same norm. Returns the grad norm before clipping (nan when not computed).
    """
    scaler.unscale_(optimizer)
    if max_grad_norm and max_grad_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm, foreach=foreach)
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # a DTensor when sharded
    else:
        norm = float("nan")
    scaler.step(optimizer)
    scaler.update()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


def _mean_metrics(acc: list[Mapping[str, float]]) -> dict[str, float]:
    keys = list(acc[0]) if acc else []
    return {k: sum(float(m[k]) for m in acc) / len(acc) for k in keys}


def objective_step(tr: TrainingRun, params: Sequence[torch.nn.Parameter], cfg: LoopConfig, step: int,
                   to_device: Callable[[Any], Any] = lambda batch: batch) -> tuple[dict[str, float], float]:
    """Optimizer step ``step`` when the objective (``tr.state.model``, possibly DDP-wrapped) maps a micro-batch
    to ``(loss, metrics)``: ``cfg.grad_accum`` micro-batches from the run's stream (DDP syncs the last one
    only), autocast, loss scaling, clipping, the optimizer and scheduler steps.

    Returns the step's metrics (``loss`` and the objective's, means over the micro-batches, and
    ``grad_norm``) and the lr it trained with. A loss that is not finite stops the run.
    """
    state, env = tr.state, tr.env
    micro: list[dict[str, float]] = []
    for k in range(cfg.grad_accum):
        batch = to_device(state.stream.next())
        with no_sync(state.model, active=k < cfg.grad_accum - 1):
            with autocast(cfg.precision, env.device):
                loss, metrics = state.model(batch)
            state.scaler.scale(loss / cfg.grad_accum).backward()
        loss_value = float(loss.detach())
        if not math.isfinite(loss_value):
            raise FloatingPointError(
                f"loss is {loss_value} at step {step} on rank {env.rank}; lower --lr or check the data "
                f"(re-running resumes from the last checkpoint in {tr.run.checkpoints})"
            )
        micro.append({"loss": loss_value, **{m: float(v) for m, v in metrics.items()}})
    lr = state.optimizer.param_groups[0]["lr"]
    grad_norm = clip_and_step(params, state.optimizer, state.scaler, state.scheduler, cfg.max_grad_norm)
    stats = _mean_metrics(micro)
    stats["grad_norm"] = grad_norm
    return stats, lr


def log_objective_window(tr: TrainingRun, cfg: LoopConfig, step: int, window: MetricWindow, lr: float,
                         **at_step: float) -> None:
    """The log record of the window ending at ``step`` (``loss`` first, the mean over ranks and micro-steps;
    the lr of ``step``; ``at_step``: values that are the same on every rank, e.g. a count of skipped files;
    the epochs read; steps per second), the progress bar, and after the first window of this process a
    first estimate of the time left."""
    mean = window.record()
    record = {"loss": mean["loss"], "lr": lr, **mean, **at_step, "epoch": round(tr.state.stream.epoch_progress, 4),
              "steps_per_s": window.steps_per_s}
    tr.log.log(step, record)
    tr.log.advance(step, {"loss": record["loss"], "lr": lr})
    if step - tr.start <= cfg.log_every and step < cfg.max_steps:
        tr.log.info(tr.progress.line(step))
