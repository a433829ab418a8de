"""The process group of a run: torchrun setup, collectives, rank-0 writes, DDP wrapping.

Joining and leaving torchrun's group are ``stylevar.runtime.distributed``'s (shared with the sharded evaluation)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from stylevar.runtime import distributed as launch


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def setup_distributed(device: str | None = None, timeout_s: float = 1800.0) -> DistEnv:
    """Join torchrun's process group (nccl on CUDA, gloo on CPU) when there is more than one process; ``device``
    forces "cpu" or "cuda" (default: CUDA when available)."""
    torchrun = launch.Torchrun.from_env()
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda requested but CUDA is not available")
        torch.cuda.set_device(torchrun.local_rank)
        dev = torch.device("cuda", torchrun.local_rank)
    else:
        dev = torch.device("cpu")
    if torchrun.distributed:
        launch.join_process_group(dev, timeout_s=timeout_s, bind_device=True)
    return DistEnv(rank=torchrun.rank, world_size=torchrun.world_size, local_rank=torchrun.local_rank, device=dev)


def all_reduce_sum(values: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Sum a float64 tensor over ranks (a copy; the input is left alone)."""
    out = values.detach().to(device=env.device, dtype=torch.float64).clone()
    if env.distributed:
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out.cpu()


def all_reduce_max(x: float, env: DistEnv) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=env.device)
    if env.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def broadcast_(tensor: torch.Tensor, env: DistEnv, src: int = 0) -> torch.Tensor:
    """In-place broadcast from ``src`` (no-op for one process)."""
    if env.distributed:
        dist.broadcast(tensor, src)
    return tensor


def broadcast_object(obj: Any, env: DistEnv, src: int = 0) -> Any:
    """``src``'s (picklable) ``obj`` on every rank (``obj`` itself for one process)."""
    if not env.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any, env: DistEnv) -> list[Any]:
    """Every rank's (picklable) ``obj``, a list indexed by rank (``[obj]`` for one process)."""
    return launch.all_gather_object(obj, env.world_size)


def main_rank_write(env: DistEnv, write: Callable[[], None]) -> None:
    """Run ``write`` on rank 0 while the others wait; an OSError there is raised on every rank."""
    error: OSError | None = None
    if env.is_main:
        try:
            write()
        except OSError as e:
            error = e
    shared = broadcast_object(error, env)
    env.barrier()  # rank 0 waits until every rank has the outcome (gloo aborts a rank whose peer left early)
    if shared is not None:
        raise shared


def wrap_ddp(module: torch.nn.Module, env: DistEnv, **kwargs) -> torch.nn.Module:
    """DistributedDataParallel around ``module`` (already on env.device) when distributed."""
    if not env.distributed:
        return module
    ids = [env.device.index] if env.device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=ids, **kwargs)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DistributedDataParallel (or the module itself)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def no_sync(model: torch.nn.Module, active: bool) -> contextlib.AbstractContextManager:
    """DDP's no_sync() for accumulation micro-steps (no-op without DDP)."""
    if active and isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()
