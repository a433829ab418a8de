"""What a checkpoint holds for an exact resume (:class:`TrainingState`), and the one resume path of every
recipe (:func:`resume`): from the newest readable checkpoint, at the same or another world size.

``step`` counts completed optimizer steps; a checkpoint taken at step s resumes at step s + 1.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from training.parts import fsdp
from training.parts.checkpoints import CheckpointManager
from training.parts.distributed import DistEnv, unwrap
from training.parts.rng import gather_rng_states, restore_rng_state, seed_everything
from training.parts.rundir import RunConfigMismatchError
from training.parts.streams import BatchStream, IterableBatchStream


@dataclass
class TrainingState:
    """Everything an exact resume needs, and the checkpoint dict it is saved as and restored from."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    stream: BatchStream | IterableBatchStream
    env: DistEnv
    scaler: torch.amp.GradScaler | None = None  # a recipe without loss scaling (GRPO) has none
    generators: Mapping[str, torch.Generator] | None = None
    # model and optimizer in a sharded part (training.parts.fsdp, DCP) instead of the .pt: --strategy fsdp
    sharded: bool = False

    def state_dict(self, step: int, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The checkpoint at ``step`` (without model and optimizer when ``sharded``); every rank calls it."""
        scaler = {} if self.scaler is None else {"scaler": self.scaler.state_dict()}
        weights = {} if self.sharded else {"model": unwrap(self.model).state_dict(),
                                           "optimizer": self.optimizer.state_dict()}
        return {
            "step": step,
            **weights,
            "scheduler": self.scheduler.state_dict(),
            **scaler,
            "data": self.stream.state_dict(),
            "rng": gather_rng_states(self.env, self.generators),
            "world_size": self.env.world_size,
            "extra": dict(extra or {}),
        }

    def load_state_dict(self, state: Mapping[str, Any], seed: int = 0) -> list[str]:
        """Restore a :meth:`state_dict`; returns notes worth logging (e.g. a changed world size)."""
        notes = []
        if self.sharded != ("sharded" in state):
            raise RunConfigMismatchError("the checkpoint's model and optimizer are " +
                                         ("sharded (--strategy fsdp)" if "sharded" in state else "whole (--strategy ddp)"))
        if self.sharded:
            fsdp.load_sharded(state["sharded"], self.model, self.optimizer)
        else:
            unwrap(self.model).load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._rate_of_this_schedule()
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.stream.load_state_dict(state["data"])
        if int(state["world_size"]) == self.env.world_size:
            restore_rng_state(state["rng"][self.env.rank], self.generators, self.env.device)
        else:
            seed_everything(seed + 7919 * int(state["step"]) + self.env.rank)
            notes.append(f"world size changed from {state['world_size']} to {self.env.world_size}: data position kept, "
                         "process RNG streams reseeded")
        return notes + list(getattr(self.stream, "notes", ()))  # e.g. shard streams restarting

    def _rate_of_this_schedule(self) -> None:
        """The resumed step's rate from this run's schedule (a longer run may have moved it)."""
        sched = self.scheduler
        rates = [base * factor(sched.last_epoch) for factor, base in zip(sched.lr_lambdas, sched.base_lrs)]
        for group, rate in zip(self.optimizer.param_groups, rates, strict=True):
            group["lr"] = rate

    def write_sharded(self, folder: Path) -> None:
        """The model's and optimizer's shards into ``folder`` (every rank)."""
        fsdp.save_sharded(folder, self.model, self.optimizer, self.env)


@dataclass(frozen=True)
class Resumed:
    """Where a run starts: ``step`` 0 and no ``path`` on a fresh run."""

    step: int = 0
    path: Path | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # the recipe's own saved state
    notes: tuple[str, ...] = ()  # lines worth logging: skipped checkpoints, a changed world size, ...


def resume(ckpts: CheckpointManager, resumable: TrainingState, seed: int) -> Resumed:
    """Restore ``resumable`` from the newest readable checkpoint; the one resume path of every recipe."""
    loaded = ckpts.load()
    notes = [f"checkpoint {b.path} is unreadable ({b.reason}); renamed to {b.set_aside_as.name}"
             for b in loaded.skipped]
    if loaded.state is None:
        return Resumed(notes=tuple(notes))
    if loaded.skipped:
        notes.append(f"resuming from the newest readable checkpoint, {loaded.path}")
    notes += resumable.load_state_dict(loaded.state, seed=seed)
    return Resumed(int(loaded.state["step"]), loaded.path, dict(loaded.state.get("extra", {})), tuple(notes))
