"""The optimizer step of the recipes whose step is one objective (training.vqvae, training.sft), and its log
line: accumulation with DDP's no_sync, autocast, loss scaling, clipping, optimizer and scheduler.

The step never waits for the device: its loss, metrics and grad norm are read a window at a time by the log."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from training.parts.distributed import no_sync
from training.parts.log import MetricWindow
from stylevar.utils.precision import autocast
from training.parts.run import TrainingRun
from training.parts.schedule import LoopConfig


def clip_and_step(params: Sequence[torch.nn.Parameter], optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                  scheduler: Any, max_grad_norm: float | None, foreach: bool | None = True) -> torch.Tensor:
    """Unscale, clip (when max_grad_norm > 0), step the optimizer and scheduler, zero the grads; the grad norm
    before clipping, a 0-d device tensor (nan when not computed). ``foreach``: one pass (None: torch's choice)."""
    scaler.unscale_(optimizer)
    if max_grad_norm and max_grad_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm, foreach=foreach)
        norm = (norm.full_tensor() if hasattr(norm, "full_tensor") else norm).detach()  # a DTensor when sharded
    else:
        norm = torch.full((), float("nan"), device=params[0].device if params else None)
    scaler.step(optimizer)
    scaler.update()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


def objective_step(tr: TrainingRun, params: Sequence[torch.nn.Parameter], cfg: LoopConfig, step: int,
                   to_device: Callable[[Any], Any] = lambda batch: batch) -> tuple[dict[str, float], float]:
    """Optimizer step ``step`` of an objective mapping a micro-batch to ``(loss, metrics)``, over
    ``cfg.grad_accum`` micro-batches: the step's metrics (device tensors, no host sync) and its lr."""
    state, env = tr.state, tr.env
    sums: dict[str, Any] = {}
    for k in range(cfg.grad_accum):
        batch = to_device(state.stream.next())
        with no_sync(state.model, active=k < cfg.grad_accum - 1):
            with autocast(cfg.precision, env.device):
                loss, metrics = state.model(batch)
            state.scaler.scale(loss / cfg.grad_accum).backward()
        for name, v in {"loss": loss, **metrics}.items():
            v = v.detach().float() if isinstance(v, torch.Tensor) else float(v)
            sums[name] = v if name not in sums else sums[name] + v
    stats = {name: v / cfg.grad_accum for name, v in sums.items()}
    tr.losses.note(step, stats["loss"])
    lr = state.optimizer.param_groups[0]["lr"]
    stats["grad_norm"] = clip_and_step(params, state.optimizer, state.scaler, state.scheduler, cfg.max_grad_norm)
    return stats, lr


def log_objective_window(tr: TrainingRun, cfg: LoopConfig, step: int, window: MetricWindow, lr: float,
                         **at_step: float) -> None:
    """Log the window ending at ``step`` (``at_step``: values the same on every rank) and update the progress;
    a loss that was not finite in the window stops the run here."""
    tr.losses.check(tr.env.rank, tr.run.checkpoints)
    mean = window.record()
    record = {"loss": mean["loss"], "lr": lr, **mean, **at_step, "epoch": round(tr.state.stream.epoch_progress, 4),
              "steps_per_s": window.steps_per_s}
    tr.log.log(step, record)
    tr.log.advance(step, {"loss": record["loss"], "lr": lr})
    if tr.progress.first_lines_due(step) and step < cfg.max_steps:
        tr.log.info(tr.progress.line(step))


def objective_steps(tr: TrainingRun, cfg: LoopConfig, params: Sequence[torch.nn.Parameter], model: torch.nn.Module,
                    to_device: Callable[[Any], Any], window: MetricWindow, skipped: Callable[[], int], *,
                    validation: Callable[[], dict[str, float]] | None, checkpoint_extra: Callable[[], dict],
                    more_stats: Callable[[int, dict], dict] | None = None) -> int:
    """The steps from ``tr.start`` to ``cfg.max_steps`` (log lines, validations, checkpoints holding
    ``checkpoint_extra()``), then the final validation (``validation`` None: no val split); the last step."""
    step = tr.start
    model.train()
    while step < cfg.max_steps:
        stats, lr = objective_step(tr, params, cfg, step + 1, to_device)
        step += 1
        if more_stats is not None:
            stats.update(more_stats(step, stats))
        window.add(stats)
        if cfg.log_due(step):
            log_objective_window(tr, cfg, step, window, lr, skipped_files=float(skipped()))
        if validation is not None and cfg.val_due(step):
            tr.log.log(step, validation(), prefix="val")
            model.train()
        if tr.checkpoint_due(step):
            tr.save(step, extra=checkpoint_extra())
    if validation is not None and step > tr.start:
        tr.log.log(step, validation(), prefix="val")
    return step
