"""Resumable, sharded data order: the sampler of one rank's epoch, and the batch streams that know where
they are (a checkpoint stores their position; a resume continues with the very next batch)."""
from __future__ import annotations

import functools
import multiprocessing
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from training.parts.distributed import DistEnv, all_gather_object
from training.parts.rng import derived_generator
from training.parts.rundir import RunConfigMismatchError


class EpochShardSampler(Sampler[int]):
    """The indices one rank reads in one epoch from a given position on: rank r takes every world_size-th index
    of the (seed, epoch) permutation from r, so a global batch is the same samples for any number of ranks."""

    def __init__(self, num_samples: int, *, epoch: int, seed: int, rank: int = 0, world_size: int = 1,
                 shuffle: bool = True, drop_last: bool = True, start: int = 0):
        self.num_samples = num_samples
        self.epoch, self.seed, self.rank, self.world_size = epoch, seed, rank, world_size
        self.shuffle, self.drop_last, self.start = shuffle, drop_last, start

    def _indices(self) -> list[int]:
        if self.shuffle:
            order = torch.randperm(self.num_samples, generator=derived_generator(self.seed, self.epoch, 0x5A)).tolist()
        else:
            order = list(range(self.num_samples))
        if self.drop_last:
            order = order[: (self.num_samples // self.world_size) * self.world_size]
        return order[self.rank :: self.world_size][self.start :]

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices())

    def __len__(self) -> int:
        return len(self._indices())


MAX_DEFAULT_WORKERS = 8  # --num-workers' default on CUDA is at most this many per rank


@functools.cache
def worker_start() -> multiprocessing.context.BaseContext:
    """How loader workers start: forked from a server process that has imported the datasets' code once, never
    from the trainer itself (a fork copies whatever lock one of its threads, TensorBoard's writer or the OpenMP
    pool, holds at that instant, and a worker that needs it waits forever). Set up once per process."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["training.parts.data"])  # read once, when the server starts
    return context


@dataclass(frozen=True)
class LoaderPolicy:
    """How recipes' DataLoaders read: ``num_workers`` persistent workers per rank, memory pinned for a GPU."""

    num_workers: int = 0
    pin_memory: bool = False

    def __post_init__(self):
        if self.num_workers < 0:
            raise ValueError(f"--num-workers must be >= 0, not {self.num_workers}")

    def options(self, *, persistent: bool) -> dict[str, Any]:
        """DataLoader's keyword arguments; ``persistent``: a loader iterated again and again (the stream's)."""
        workers = self.num_workers > 0
        return {"num_workers": self.num_workers, "pin_memory": self.pin_memory,
                "persistent_workers": persistent and workers,
                "multiprocessing_context": worker_start() if workers else None}


def default_num_workers(device_type: str, cpus: int, local_processes: int) -> int:
    """``--num-workers`` when not given: on CUDA this process's share of ``cpus`` less one, in [1,
    MAX_DEFAULT_WORKERS]; on the CPU 0."""
    if device_type != "cuda":
        return 0
    return max(1, min(MAX_DEFAULT_WORKERS, cpus // max(1, local_processes) - 1))


def loader_policy(num_workers: int | None, device: torch.device) -> LoaderPolicy:
    """The policy of a run on ``device`` (``num_workers`` None: :func:`default_num_workers`)."""
    if num_workers is None:
        from stylevar.utils.threads import cpu_budget

        num_workers = default_num_workers(device.type, cpu_budget().cpus, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return LoaderPolicy(num_workers, pin_memory=device.type == "cuda")


@dataclass(frozen=True)
class BatchStreamConfig:
    global_batch: int  # samples per optimizer step, all ranks and micro-steps together
    grad_accum: int = 1
    seed: int = 0
    shuffle: bool = True
    collate_fn: Callable[[list], Any] | None = None
    loader: LoaderPolicy = field(default_factory=LoaderPolicy)


def micro_batch_size(global_batch: int, grad_accum: int, world_size: int) -> int:
    per = global_batch // (grad_accum * world_size)
    if per * grad_accum * world_size != global_batch or per == 0:
        raise ValueError(f"--batch-size {global_batch} must be a positive multiple of grad_accum ({grad_accum}) x "
                         f"world size ({world_size})")
    return per


class EpochItems(Dataset):
    """A map-style dataset read by (epoch, index) keys, calling ``set_epoch`` in whichever process reads."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)  # type: ignore[attr-defined]
        return self.dataset[index]


class _Keyed(Sampler[tuple[int, int]]):
    """An EpochShardSampler's indices as (epoch, index) keys of :class:`EpochItems` (its epoch read at each pass)."""

    def __init__(self, sampler: EpochShardSampler):
        self.sampler = sampler

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.sampler.epoch
        return ((epoch, i) for i in self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


class BatchStream:
    """An endless stream of micro-batches over epochs; loading its ``state_dict()`` resumes at the very next batch."""

    def __init__(self, dataset: Dataset, cfg: BatchStreamConfig, env: DistEnv):
        self.dataset, self.cfg, self.env = dataset, cfg, env
        self.micro_batch = micro_batch_size(cfg.global_batch, cfg.grad_accum, env.world_size)
        n = len(dataset)  # type: ignore[arg-type]
        self.batches_per_epoch = n // (self.micro_batch * env.world_size)
        if self.batches_per_epoch == 0:
            raise ValueError(f"dataset has {n} samples, fewer than one global micro-batch "
                             f"({self.micro_batch} x {env.world_size} ranks)")
        self.epoch = 0
        self.index = 0
        self._it: Iterator | None = None
        self._sampler = EpochShardSampler(n, epoch=0, seed=cfg.seed, rank=env.rank, world_size=env.world_size,
                                          shuffle=cfg.shuffle, drop_last=True)
        self._loader = DataLoader(EpochItems(dataset), batch_size=self.micro_batch, sampler=_Keyed(self._sampler),
                                  drop_last=True, collate_fn=cfg.collate_fn, **cfg.loader.options(persistent=True))

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "seed": self.cfg.seed}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        if int(state["seed"]) != self.cfg.seed:
            raise RunConfigMismatchError(f"data seed {state['seed']} in checkpoint, {self.cfg.seed} now")
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._it = None

    def _open(self) -> Iterator:
        # the dataset's set_epoch: by EpochItems, in the process that reads each item
        self._sampler.epoch, self._sampler.start = self.epoch, self.index * self.micro_batch
        return iter(self._loader)

    def next(self) -> Any:
        if self.index >= self.batches_per_epoch:
            self.epoch, self.index, self._it = self.epoch + 1, 0, None
        if self._it is None:
            self._it = self._open()
        batch = next(self._it)
        self.index += 1
        return batch

    @property
    def epoch_progress(self) -> float:
        return self.epoch + self.index / self.batches_per_epoch


class IterableBatchStream:
    """The :class:`BatchStream` interface over an IterableDataset: each rank starts its next epoch when its share
    runs out; a resume skips the batches consumed (exact when the order depends only on (seed, epoch))."""

    def __init__(self, dataset: IterableDataset, cfg: BatchStreamConfig, env: DistEnv, num_samples: int | None = None):
        self.dataset, self.cfg, self.env = dataset, cfg, env
        self.micro_batch = micro_batch_size(cfg.global_batch, cfg.grad_accum, env.world_size)
        n = num_samples if num_samples is not None else getattr(dataset, "num_samples", None)
        self.batches_per_epoch = max(1, n // (self.micro_batch * env.world_size)) if n else None
        self.epoch = 0
        self.index = 0
        self._it: Iterator | None = None
        self.notes: list[str] = []

    def state_dict(self) -> dict[str, Any]:
        per_rank = all_gather_object((self.epoch, self.index), self.env)
        return {"epoch": per_rank[0][0], "index": per_rank[0][1], "seed": self.cfg.seed,
                "per_rank": [list(p) for p in per_rank]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if int(state["seed"]) != self.cfg.seed:
            raise RunConfigMismatchError(f"data seed {state['seed']} in checkpoint, {self.cfg.seed} now")
        per_rank = state.get("per_rank") or [[state["epoch"], state["index"]]]
        if len(per_rank) == self.env.world_size:
            self.epoch, self.index = (int(v) for v in per_rank[self.env.rank])
        else:
            self.epoch, self.index = min(int(p[0]) for p in per_rank) + 1, 0
            self.notes.append(f"world size changed: shard streams restart at epoch {self.epoch}")
        self._it = None

    def _open(self) -> Iterator:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(self.epoch)  # type: ignore[attr-defined]
        # the epoch is the dataset's own state here (its shard order): new workers for each epoch
        loader = DataLoader(self.dataset, batch_size=self.micro_batch, drop_last=True, collate_fn=self.cfg.collate_fn,
                            **self.cfg.loader.options(persistent=False))
        it = iter(loader)
        for _ in range(self.index):  # fast-forward to the saved position
            next(it)
        return it

    def next(self) -> Any:
        for _ in range(2):
            if self._it is None:
                self._it = self._open()
            try:
                batch = next(self._it)
            except StopIteration:
                if self.index == 0:
                    break
                self.epoch, self.index, self._it = self.epoch + 1, 0, None
                continue
            self.index += 1
            return batch
        raise RuntimeError(f"rank {self.env.rank} got no batch of {self.micro_batch} from its share of the data "
                           "(too few shards or samples for this many processes and workers)")

    @property
    def epoch_progress(self) -> float:
        if not self.batches_per_epoch:
            return float(self.epoch)
        return self.epoch + min(self.index / self.batches_per_epoch, 1.0)


def make_stream(dataset: Dataset, cfg: BatchStreamConfig, env: DistEnv) -> "BatchStream | IterableBatchStream":
    """A resumable batch stream for a map-style or an iterable dataset."""
    if isinstance(dataset, IterableDataset):
        return IterableBatchStream(dataset, cfg, env)
    return BatchStream(dataset, cfg, env)


def eval_loader(dataset: Dataset, batch_size: int, env: DistEnv, *, num_workers: int = 0, collate_fn=None) -> DataLoader:
    """Rank's share of a validation set (every sample exactly once across ranks, no padding)."""
    sampler = EpochShardSampler(
        len(dataset), epoch=0, seed=0, rank=env.rank, world_size=env.world_size, shuffle=False, drop_last=False  # type: ignore[arg-type]
    )
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate_fn,
                      **LoaderPolicy(num_workers).options(persistent=False))


def move_to(batch: Any, device: torch.device) -> Any:
    """Tensors in (nested) dicts, lists and tuples moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: move_to(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to(v, device) for v in batch)
    return batch
