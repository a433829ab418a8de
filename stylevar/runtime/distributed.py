"""torchrun's process group: what torchrun set in the environment, joining the group, gathering objects.

One process (WORLD_SIZE unset or 1) needs no group: every helper is then a no-op. nccl on CUDA, gloo on the CPU.
"""
from __future__ import annotations

import datetime
import os
import sys
from dataclasses import dataclass
from typing import Any

import torch

TEARDOWN_WAIT_S = 60.0  # how long a rank waits at teardown for the others before it gives up waiting


@dataclass(frozen=True)
class Torchrun:
    """This process's place in a torchrun launch (RANK, WORLD_SIZE, LOCAL_RANK; 0, 1, 0 without one)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> Torchrun:
        return cls(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                   int(os.environ.get("LOCAL_RANK", "0")))

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def rank_device(device: torch.device, launch: Torchrun) -> torch.device:
    """The device this process computes on: under torchrun the rank's own GPU, else ``device`` as given."""
    if launch.distributed and device.type == "cuda":
        return torch.device("cuda", launch.local_rank)
    return device


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def join_process_group(device: torch.device, *, timeout_s: float | None = None, bind_device: bool = False) -> bool:
    """Join torchrun's process group with the backend for ``device`` unless in one already; True when it was joined
    here (the caller then leaves it). ``bind_device`` binds it to a CUDA ``device``."""
    import torch.distributed as dist
    if dist.is_initialized():
        return False
    options: dict[str, Any] = {}
    if timeout_s is not None:
        options["timeout"] = datetime.timedelta(seconds=timeout_s)
    if bind_device and device.type == "cuda":
        options["device_id"] = device
    dist.init_process_group(backend_for(device), init_method="env://", **options)
    return True


def leave_process_group() -> None:
    """Leave the process group once every rank has reached here (gloo aborts a rank whose peer left first),
    waiting at most `TEARDOWN_WAIT_S` for a failed rank. A no-op without a group."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=TEARDOWN_WAIT_S))
        else:
            dist.barrier()
    except RuntimeError as e:
        print(f"warning: leaving the process group without every rank: {str(e).splitlines()[0]}", file=sys.stderr)
    finally:
        dist.destroy_process_group()


def all_gather_object(obj: Any, world_size: int) -> list[Any]:
    """Every rank's (picklable) ``obj``, a list indexed by rank (``[obj]`` for one process)."""
    if world_size <= 1:
        return [obj]
    import torch.distributed as dist
    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, obj)
    return out
