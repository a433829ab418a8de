"""Which device each rank of a sharded evaluation computes on (stylevar.evaluate.ranks.start_shard)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from stylevar.evaluate import ranks
from stylevar.runtime.distributed import Torchrun, rank_device


@pytest.fixture
def second_rank(monkeypatch):
    """This process as rank 1 of 2 (local rank 1) under torchrun, with the group and the GPU calls recorded."""
    for name, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")):
        monkeypatch.setenv(name, value)
    calls: dict[str, torch.device] = {}
    monkeypatch.setattr(ranks, "join_process_group", lambda device: calls.setdefault("group", device) and False)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.setdefault("set_device", device))
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    return calls


@pytest.mark.parametrize("named", ["cuda:0", "cuda", "cuda:1"])
def test_each_rank_takes_its_local_gpu_whatever_index_was_named(second_rank, named):
    """Issue 60, point 10: `--device cuda:0` put every rank on GPU 0."""
    shard, device = ranks.start_shard(torch.device(named))
    assert device == torch.device("cuda", 1)
    assert second_rank == {"set_device": device, "group": device}
    assert (shard.rank, shard.world) == (1, 2)


def test_the_cpu_and_a_single_process_keep_the_named_device():
    launch = Torchrun(rank=1, world_size=2, local_rank=1)
    assert rank_device(torch.device("cpu"), launch) == torch.device("cpu")
    assert rank_device(torch.device("cuda:3"), Torchrun()) == torch.device("cuda:3")
    assert rank_device(torch.device("cuda:0"), Torchrun(rank=5, world_size=8, local_rank=1)) == torch.device("cuda:1")
