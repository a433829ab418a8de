"""An evaluation over torchrun's processes (WORLD_SIZE > 1): which batches this rank scores, and the merge."""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from stylevar.runtime.distributed import (Torchrun, all_gather_object, join_process_group, leave_process_group,
                                          rank_device)
from stylevar.evaluate.scoring import batch_slices


@dataclass(frozen=True)
class Shard:
    """This process's part of a sharded run: every ``world``-th batch from ``rank`` on."""

    rank: int = 0
    world: int = 1
    owned: bool = False  # the process group was started here (`close` ends it)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def batches(self, n: int, batch_size: int) -> list[slice]:
        return batch_slices(n, batch_size)[self.rank::self.world]

    def gather(self, items: list) -> list:
        """Every process's ``items``, concatenated in rank order (this process's alone when not sharded)."""
        return [x for part in all_gather_object(items, self.world) for x in part]

    def close(self) -> None:
        if self.owned:
            leave_process_group()


def start_shard(device: torch.device) -> tuple[Shard, torch.device]:
    """Under torchrun (WORLD_SIZE > 1): join the process group, each rank on its own GPU; else a single process."""
    launch = Torchrun.from_env()
    if not launch.distributed:
        return Shard(), device
    import torch.distributed as dist
    named, device = device, rank_device(device, launch)
    if named.index not in (None, device.index) and launch.rank == 0:
        print(f"note: under torchrun each rank uses its local GPU (cuda:LOCAL_RANK), not {named}; "
              "CUDA_VISIBLE_DEVICES chooses the GPUs", file=sys.stderr)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    owned = join_process_group(device)
    return Shard(dist.get_rank(), dist.get_world_size(), owned), device
