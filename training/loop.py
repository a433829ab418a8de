"""Shared parts of every training recipe: distributed setup, seeding, resumable data order,
atomic checkpoints with exact resume, run-directory bookkeeping and logging.

A recipe (``training.vqvae``, ``training.sft``, ``training.grpo``) is a short script with its own step
loop over these parts (no trainer class, no callbacks):

    env = setup_distributed()
    run = RunDir.prepare(out, config_dict, env, free_keys=...)     # RUN/config.json, resume check
    stream = make_stream(dataset, BatchStreamConfig(...), env)      # seeded, sharded, resumable
    cfg = loop_config(args, precision)
    state = TrainingState(model, optimizer, scheduler, stream, env, scaler=...)  # what a checkpoint holds
    with TrainingRun.for_loop(run, state, cfg) as tr:   # resumes from the newest readable checkpoint
        window, step = MetricWindow(env), tr.start
        while step < cfg.max_steps:
            stats, lr = objective_step(tr, params, cfg, step + 1)  # or the recipe's own step (GRPO)
            step += 1
            window.add(stats)
            if cfg.log_due(step):
                log_objective_window(tr, cfg, step, window, lr)  # or tr.log.log(step, window.record())
            if tr.checkpoint_due(step):
                tr.save(step, extra={...})                    # the recipe's own state: tr.resumed.extra
        tr.finish(step, write_final)                          # summary line, RUN/final (rank 0, atomic)

Conventions
- ``step`` counts completed optimizer steps; a checkpoint taken at step s resumes at step s + 1.
- The global batch (``--batch-size``) is the number of samples per optimizer step across all ranks
  and accumulation micro-steps, so the same command gives the same training on 1 or N processes.
- Randomness that must agree across ranks or survive a resume without stored state (augmentation,
  alpha jitter) is derived from ``(seed, ...)`` with :func:`derived_generator`, not from global RNGs.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import os
import random
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from stylevar.atomic import (
    DISK_FULL_ERRNOS,
    WriteFailedError,
    atomic_folder,
    atomic_write,
    atomic_write_text,
    fsync_dir,
    remove_quietly,
    write_failure,
)
from stylevar.devices import parse_dtype

CONFIG_NAME = "config.json"
LOG_NAME = "log.jsonl"


class RunConfigMismatchError(RuntimeError):
    """The RUN directory belongs to a run with a different configuration."""


class CheckpointsUnreadableError(RuntimeError):
    """``RUN/checkpoints`` holds checkpoints, but none of them can be read (the message names each)."""


# --------------------------------------------------------------------------------------------------
# distributed setup
# --------------------------------------------------------------------------------------------------
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
    """Join the torchrun process group when launched by torchrun with more than one process.

    Backend: nccl on CUDA, gloo on CPU. A single process (plain ``python -m ...``) needs no group.
    ``device`` forces "cpu" or "cuda"; default: CUDA when available.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda requested but CUDA is not available")
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if dev.type == "cuda" else "gloo",
            timeout=datetime.timedelta(seconds=timeout_s),
            **({"device_id": dev} if dev.type == "cuda" else {}),
        )
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank, device=dev)


TEARDOWN_WAIT_S = 60.0  # how long a rank waits at teardown for the others before it gives up waiting


def teardown_distributed() -> None:
    """Leave the process group once every rank has reached here (gloo aborts a rank whose peer destroyed the
    group while it was still finishing, e.g. rank 0 writing a file: SIGABRT seen in tests/test_loop.py). A
    rank that never comes (it failed) is waited for at most TEARDOWN_WAIT_S; the group is destroyed anyway."""
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


def all_reduce_sum(values: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Sum a float64 tensor over ranks (a copy; the input is left alone)."""
    out = values.detach().to(device=env.device, dtype=torch.float64).clone()
    if env.distributed:
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out.cpu()


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


def main_rank_write(env: DistEnv, write: Callable[[], None]) -> None:
    """Run ``write`` on rank 0 while the other ranks wait; an OSError there (a :class:`WriteFailedError`:
    disk full) is raised on every rank, so no rank is left waiting at a barrier for a write that failed."""
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


# --------------------------------------------------------------------------------------------------
# seeding and RNG state
# --------------------------------------------------------------------------------------------------
def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def derived_generator(*keys: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch.Generator seeded from a tuple of integers, e.g. (seed, step, stream).

    Used for randomness that must be the same on every rank and after a resume without storing state.
    """
    state = np.random.SeedSequence([int(k) % 2**64 for k in keys]).generate_state(1, dtype=np.uint64)
    return torch.Generator(device=device).manual_seed(int(state[0]) & 0x7FFFFFFFFFFFFFFF)


def process_seed(seed: int, rank: int) -> int:
    """A per-process seed for the global RNGs after model construction (distinct for each (seed, rank))."""
    return derived_generator(seed, rank, 0x5EED).initial_seed() % (2**63)


def capture_rng_state(generators: Mapping[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Every RNG state of this process as a dict that ``torch.load(weights_only=True)`` can read."""
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_internal, py_gauss = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": py_version, "internal": list(py_internal), "gauss": py_gauss},
        "numpy": {
            "name": np_name,
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "generators": {name: g.get_state() for name, g in (generators or {}).items()},
    }
    return state


def restore_rng_state(state: Mapping[str, Any], generators: Mapping[str, torch.Generator] | None = None) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    npst = state["numpy"]
    np.random.set_state(
        (npst["name"], npst["keys"].numpy().astype(np.uint32), npst["pos"], npst["has_gauss"], npst["gauss"])
    )
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    saved = state.get("generators", {})
    for name, g in (generators or {}).items():
        if name not in saved:
            raise KeyError(f"checkpoint has no state for generator {name!r}")
        g.set_state(saved[name])


def gather_rng_states(env: DistEnv, generators: Mapping[str, torch.Generator] | None = None) -> list[dict]:
    """RNG states of all ranks (a list indexed by rank)."""
    mine = capture_rng_state(generators)
    if not env.distributed:
        return [mine]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, mine)
    return out


# --------------------------------------------------------------------------------------------------
# resumable, sharded data order
# --------------------------------------------------------------------------------------------------
class EpochShardSampler(Sampler[int]):
    """The indices one rank reads in one epoch, from a given position on.

    The epoch's order is a permutation seeded by (seed, epoch) (or 0..n-1 without shuffling). Rank r
    takes every world_size-th index starting at r, so the first ``B`` indices of each rank together are
    the first ``B * world_size`` of the permutation: a global batch is the same set of samples for any
    number of ranks. ``drop_last`` trims the tail so every rank has the same number of samples.
    """

    def __init__(
        self,
        num_samples: int,
        *,
        epoch: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        drop_last: bool = True,
        start: int = 0,
    ):
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


@dataclass(frozen=True)
class BatchStreamConfig:
    global_batch: int  # samples per optimizer step, all ranks and micro-steps together
    grad_accum: int = 1
    seed: int = 0
    num_workers: int = 0
    shuffle: bool = True
    collate_fn: Callable[[list], Any] | None = None
    pin_memory: bool = False


def micro_batch_size(global_batch: int, grad_accum: int, world_size: int) -> int:
    per = global_batch // (grad_accum * world_size)
    if per * grad_accum * world_size != global_batch or per == 0:
        raise ValueError(
            f"--batch-size {global_batch} must be a positive multiple of grad_accum ({grad_accum}) x "
            f"world size ({world_size})"
        )
    return per


class BatchStream:
    """An endless stream of micro-batches over epochs that knows where it is.

    ``state_dict()`` gives {epoch, index, seed}: ``index`` is the number of global micro-batch rounds
    already consumed in the epoch. Loading it makes the next batch exactly the one that would have come
    next. If the dataset has ``set_epoch(epoch)`` it is called before each epoch is read (workers are
    created per epoch, so they see it).
    """

    def __init__(self, dataset: Dataset, cfg: BatchStreamConfig, env: DistEnv):
        self.dataset, self.cfg, self.env = dataset, cfg, env
        self.micro_batch = micro_batch_size(cfg.global_batch, cfg.grad_accum, env.world_size)
        n = len(dataset)  # type: ignore[arg-type]
        self.batches_per_epoch = n // (self.micro_batch * env.world_size)
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"dataset has {n} samples, fewer than one global micro-batch "
                f"({self.micro_batch} x {env.world_size} ranks)"
            )
        self.epoch = 0
        self.index = 0
        self._it: Iterator | None = None

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "seed": self.cfg.seed}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        if int(state["seed"]) != self.cfg.seed:
            raise RunConfigMismatchError(f"data seed {state['seed']} in checkpoint, {self.cfg.seed} now")
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._it = None

    def _open(self) -> Iterator:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(self.epoch)  # type: ignore[attr-defined]
        sampler = EpochShardSampler(
            len(self.dataset),  # type: ignore[arg-type]
            epoch=self.epoch,
            seed=self.cfg.seed,
            rank=self.env.rank,
            world_size=self.env.world_size,
            shuffle=self.cfg.shuffle,
            drop_last=True,
            start=self.index * self.micro_batch,
        )
        loader = DataLoader(
            self.dataset,
            batch_size=self.micro_batch,
            sampler=sampler,
            drop_last=True,
            num_workers=self.cfg.num_workers,
            collate_fn=self.cfg.collate_fn,
            pin_memory=self.cfg.pin_memory,
            persistent_workers=False,
        )
        return iter(loader)

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
        """Fractional epochs consumed so far."""
        return self.epoch + self.index / self.batches_per_epoch


class IterableBatchStream:
    """The :class:`BatchStream` interface over an IterableDataset (e.g. webdataset shards).

    Each rank reads its own share (the dataset splits by rank and worker) and starts its next epoch
    when its share runs out, so uneven shards never stall a step. ``state_dict()`` gathers every
    rank's (epoch, index); a resume reopens the epoch and skips the batches already consumed (exact
    when the dataset's order depends only on (seed, epoch), as ``training.data``'s shard reader does).
    """

    def __init__(self, dataset: IterableDataset, cfg: BatchStreamConfig, env: DistEnv,
                 num_samples: int | None = None):
        self.dataset, self.cfg, self.env = dataset, cfg, env
        self.micro_batch = micro_batch_size(cfg.global_batch, cfg.grad_accum, env.world_size)
        n = num_samples if num_samples is not None else getattr(dataset, "num_samples", None)
        self.batches_per_epoch = max(1, n // (self.micro_batch * env.world_size)) if n else None
        self.epoch = 0
        self.index = 0
        self._it: Iterator | None = None
        self.notes: list[str] = []

    def state_dict(self) -> dict[str, Any]:
        mine = (self.epoch, self.index)
        if self.env.distributed:
            per_rank: list[Any] = [None] * self.env.world_size
            dist.all_gather_object(per_rank, mine)
        else:
            per_rank = [mine]
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
        loader = DataLoader(self.dataset, batch_size=self.micro_batch, drop_last=True,
                            num_workers=self.cfg.num_workers, collate_fn=self.cfg.collate_fn,
                            pin_memory=self.cfg.pin_memory)
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
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers, collate_fn=collate_fn)


# --------------------------------------------------------------------------------------------------
# run directory and config
# --------------------------------------------------------------------------------------------------
def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


@dataclass(frozen=True)
class RunDir:
    """``RUN/``: config.json, log.jsonl, tb/, checkpoints/, final/."""

    root: Path

    @property
    def config_path(self) -> Path:
        return self.root / CONFIG_NAME

    @property
    def log_path(self) -> Path:
        return self.root / LOG_NAME

    @property
    def tb(self) -> Path:
        return self.root / "tb"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def final(self) -> Path:
        return self.root / "final"

    @classmethod
    def prepare(
        cls,
        root: str | os.PathLike,
        config: Mapping[str, Any],
        env: DistEnv,
        *,
        free_keys: Sequence[str] = (),
    ) -> "RunDir":
        """Create RUN/ and write its config, or check that an existing run has the same config.

        Keys in ``free_keys`` (output paths, logging and checkpoint cadence, worker counts) may change
        between invocations; any other difference raises :class:`RunConfigMismatchError` before any
        work starts. Every rank checks, rank 0 writes (an unchanged config.json is not rewritten). Stale
        temporary files of a killed process are removed first, so they cannot keep a full disk full; a
        failed write of config.json (disk full) exits with one line (SystemExit), like the recipes'
        input errors.
        """
        run = cls(Path(root))
        new = _jsonable(dict(config))
        text = json.dumps(new, indent=1, sort_keys=True) + "\n"
        old_text = run.config_path.read_text() if run.config_path.exists() else None
        if old_text is not None:
            try:
                old = json.loads(old_text)
            except json.JSONDecodeError as e:
                raise RunConfigMismatchError(f"{run.config_path} is not valid JSON ({e}); use a new --out") from e
            keys = (set(old) | set(new)) - set(free_keys)
            diff = sorted(k for k in keys if old.get(k, "<absent>") != new.get(k, "<absent>"))
            if diff:
                lines = ", ".join(f"{k}: {old.get(k, '<absent>')!r} -> {new.get(k, '<absent>')!r}" for k in diff)
                raise RunConfigMismatchError(
                    f"{run.root} holds a run with a different configuration ({lines}). "
                    "Re-run the same command to resume it, or choose a new --out."
                )
        env.barrier()

        def write() -> None:
            remove_stale_temps(run.root, ".*.tmp")
            remove_stale_temps(run.checkpoints)
            try:
                run.checkpoints.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise write_failure(run.checkpoints, e) from e
            if text != old_text:
                atomic_write_text(run.config_path, text)

        try:
            main_rank_write(env, write)
        except WriteFailedError as e:
            raise SystemExit(f"error: {e}") from None
        return run

    def truncate_log(self, last_step: int) -> None:
        """Drop log lines past ``last_step`` (written after the checkpoint a resume starts from)."""
        if not self.log_path.exists():
            return
        kept = []
        for line in self.log_path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line from a killed process
            if int(rec.get("step", 0)) <= last_step:
                kept.append(line)
        atomic_write_text(self.log_path, "".join(s + "\n" for s in kept))


# --------------------------------------------------------------------------------------------------
# checkpoints
# --------------------------------------------------------------------------------------------------
_CKPT_RE = re.compile(r"^step-(\d{8})\.pt$")
SHARDED_SUFFIX = ".dcp"  # the folder of a checkpoint's shards (training.sharding), next to its .pt


def checkpoint_paths(folder: str | os.PathLike) -> list[tuple[int, Path]]:
    """The ``step-XXXXXXXX.pt`` files in ``folder`` as (step, path), oldest first (none: an empty list)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _CKPT_RE.match(p.name))]
    return sorted(found)


def newest_checkpoint(src: str | os.PathLike, *, sharded: bool = False) -> Path:
    """``src`` itself if it is a file, else the newest ``step-*.pt`` of a RUN (``src/checkpoints``) or of the
    folder ``src``; with ``sharded`` only those with their sharded part (``step-*.dcp/``, --strategy fsdp)."""
    path = Path(src)
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint or RUN directory not found: {path}")
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    found = [p for _, p in checkpoint_paths(folder) if not sharded or p.with_suffix(SHARDED_SUFFIX).is_dir()]
    if not found:
        what = f"sharded checkpoint (step-*.pt with its {SHARDED_SUFFIX} folder)" if sharded else "step-*.pt checkpoint"
        raise FileNotFoundError(f"no {what} in {folder}")
    return found[-1]


class CheckpointManager:
    """``RUN/checkpoints/step-XXXXXXXX.pt``; written atomically by rank 0, the newest ``keep`` kept."""

    def __init__(self, directory: str | os.PathLike, env: DistEnv, keep: int = 3):
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.dir, self.env, self.keep = Path(directory), env, keep

    def paths(self) -> list[tuple[int, Path]]:
        return checkpoint_paths(self.dir)

    def save(self, step: int, state: Mapping[str, Any],
             write_sharded: Callable[[Path], None] | None = None) -> Path | None:
        """Write ``state`` for ``step`` (rank 0 only; all ranks wait). ``write_sharded(folder)`` (every rank
        calls it, first) writes a sharded part to ``step-XXXXXXXX.dcp/``; the ``.pt`` then names it.

        A failed write (disk full) raises :class:`WriteFailedError` on every rank, with nothing of this
        step left behind (no partial file, no sharded part) and the earlier checkpoints untouched; the
        oldest are pruned only after the new one is complete.
        """
        path = self.dir / f"step-{step:08d}.pt"
        if write_sharded is not None:
            write_sharded(path.with_suffix(SHARDED_SUFFIX))
            state = {**state, "sharded": path.with_suffix(SHARDED_SUFFIX).name}
        main_rank_write(self.env, lambda: self._write(path, dict(state)))
        return path if self.env.is_main else None

    def _write(self, path: Path, state: dict[str, Any]) -> None:
        """``path`` holding ``state`` (atomically), then the checkpoints past ``keep`` removed."""
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            atomic_write(path, lambda f: torch.save(state, f), size=tensor_bytes(state), what="checkpoint")
        except WriteFailedError:
            remove_quietly(path.with_suffix(SHARDED_SUFFIX))  # a sharded part no .pt names is no checkpoint
            raise
        for _, old in self.paths()[: -self.keep]:
            old.unlink(missing_ok=True)
            shutil.rmtree(old.with_suffix(SHARDED_SUFFIX), ignore_errors=True)

    def last_good_note(self) -> str:
        """What a failed write leaves to resume from, and how: one sentence for the user."""
        found = self.paths()
        if not found:
            return ("No earlier checkpoint exists: free some space and re-run the same command to start again "
                    "from step 0")
        step, last = found[-1]
        return (f"The last good checkpoint, {last.name} (step {step}), is kept: free some space and re-run "
                "the same command to resume from it")

    def load(self) -> LoadedCheckpoint:
        """The newest readable checkpoint (read on every rank); its ``state`` is None on a fresh run.

        Newer files that cannot be read (truncated, empty, not a checkpoint) are skipped, reported in
        ``skipped`` and renamed to ``*.pt.corrupt``, so they are neither tried again nor counted among the
        ``keep`` newest. Files present but none readable: :class:`CheckpointsUnreadableError`, naming each
        file and why (nothing is renamed). Stale temp files are removed.
        """
        if self.env.is_main and self.dir.is_dir():
            remove_stale_temps(self.dir)
            for p in self.dir.glob(f"step-*{SHARDED_SUFFIX}"):  # shards whose .pt was never written
                if not p.with_suffix(".pt").exists():
                    shutil.rmtree(p, ignore_errors=True)
        self.env.barrier()
        found = self.paths()
        bad: list[BadCheckpoint] = []
        for step, path in reversed(found):
            try:
                state = read_checkpoint(path)
            except CorruptCheckpointError as e:
                bad.append(BadCheckpoint(path, str(e)))
                continue
            if int(state["step"]) != step:
                raise RuntimeError(f"{path} holds step {state['step']}, its name says {step}")
            if "sharded" in state:
                shards = path.parent / str(state["sharded"])
                if not (shards / ".metadata").is_file():
                    bad.append(BadCheckpoint(path, f"its sharded part {shards.name} is missing or incomplete"))
                    continue
                state["sharded"] = str(shards)
            self._set_aside(bad)
            return LoadedCheckpoint(state, path, tuple(bad))
        if bad:
            raise CheckpointsUnreadableError(
                f"no readable checkpoint in {self.dir}: {'; '.join(map(str, bad))}. Restore a good copy, or move "
                "these files away to start the run from step 0")
        return LoadedCheckpoint(None, None)

    def _set_aside(self, bad: Sequence[BadCheckpoint]) -> None:
        """Rename unreadable files to ``*.corrupt`` once every rank is past reading them (rank 0)."""
        if not bad:
            return
        self.env.barrier()
        if self.env.is_main:
            for b in bad:
                os.replace(b.path, b.set_aside_as)
            fsync_dir(self.dir)
        self.env.barrier()


class CorruptCheckpointError(ValueError):
    """One checkpoint file cannot be read; the message says why."""


@dataclass(frozen=True)
class BadCheckpoint:
    """A checkpoint file that could not be read, and why."""

    path: Path
    reason: str

    @property
    def set_aside_as(self) -> Path:
        return self.path.with_name(self.path.name + ".corrupt")

    def __str__(self) -> str:
        return f"{self.path.name} ({self.reason})"


@dataclass(frozen=True)
class LoadedCheckpoint:
    state: dict[str, Any] | None  # None: no checkpoint yet
    path: Path | None
    skipped: tuple[BadCheckpoint, ...] = ()  # newer files that could not be read, newest first


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint dict from ``path``; :class:`CorruptCheckpointError` if the file cannot be used.

    ``torch.load`` raises many types on damaged files (a truncated zip: RuntimeError "PytorchStreamReader
    failed reading zip archive"; an empty or cut pickle: EOFError; garbage: UnpicklingError ...): all of
    them mean the same thing here.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as e:
        raise CorruptCheckpointError(f"cannot read it: {e.strerror or e}") from e
    if size == 0:
        raise CorruptCheckpointError("empty file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure to load means the file is unusable
        gist = (str(e).strip().splitlines() or [""])[0].split(". ")[0]  # torch appends paragraphs of advice
        raise CorruptCheckpointError(f"{type(e).__name__}: {gist}" if gist else type(e).__name__) from e
    if not isinstance(state, Mapping) or "step" not in state:
        raise CorruptCheckpointError("not a training checkpoint (no 'step' entry)")
    return dict(state)


def remove_stale_temps(folder: Path, pattern: str = ".step-*.tmp") -> None:
    """Remove the temporary files and folders of writes a killed process left in ``folder`` (by default
    those of checkpoints), so they cannot keep a full disk full."""
    if folder.is_dir():
        for p in folder.glob(pattern):
            remove_quietly(p)


def tensor_bytes(obj: Any) -> int:
    """The bytes of the tensors in ``obj`` (nested mappings, lists, tuples): about its torch.save size."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Mapping):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DistributedDataParallel (or the module itself)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


@dataclass
class TrainingState:
    """Everything an exact resume needs, and the checkpoint dict it is saved as and restored from."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    stream: "BatchStream | IterableBatchStream"
    env: DistEnv
    scaler: torch.amp.GradScaler | None = None  # a recipe without loss scaling (GRPO) has none
    generators: Mapping[str, torch.Generator] | None = None
    # model and optimizer in a sharded part (training.sharding, DCP) instead of the .pt: --strategy fsdp
    sharded: bool = False

    def state_dict(self, step: int, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The checkpoint at ``step`` (without model and optimizer when ``sharded``: :meth:`write_sharded`
        writes those). Call on every rank (RNG states are gathered)."""
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
            from training import sharding

            sharding.load_sharded(state["sharded"], self.model, self.optimizer)
        else:
            unwrap(self.model).load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.stream.load_state_dict(state["data"])
        if int(state["world_size"]) == self.env.world_size:
            restore_rng_state(state["rng"][self.env.rank], self.generators)
        else:
            seed_everything(seed + 7919 * int(state["step"]) + self.env.rank)
            notes.append(
                f"world size changed from {state['world_size']} to {self.env.world_size}: data position kept, "
                "process RNG streams reseeded"
            )
        return notes + list(getattr(self.stream, "notes", ()))  # e.g. shard streams restarting

    def write_sharded(self, folder: Path) -> None:
        """The model's and optimizer's shards into ``folder`` (every rank)."""
        from training import sharding

        sharding.save_sharded(folder, self.model, self.optimizer, self.env)


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


# --------------------------------------------------------------------------------------------------
# skipped files
# --------------------------------------------------------------------------------------------------
class SkipTracker:
    """Collects the ``skipped`` file lists of batches (every rank) for the log and a final report."""

    def __init__(self, env: DistEnv):
        self.env = env
        self.paths: set[str] = set()

    def take(self, batch: dict[str, Any]) -> dict[str, Any]:
        self.paths.update(batch.pop("skipped", []))
        return batch

    def all_paths(self) -> list[str]:
        if not self.env.distributed:
            return sorted(self.paths)
        gathered: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(gathered, sorted(self.paths))
        return sorted({p for part in gathered for p in part})


def write_skip_report(run: RunDir, paths: Sequence[str], reasons: dict[str, str]) -> Path:
    report = run.root / "skipped.json"
    atomic_write_text(
        report, json.dumps({"count": len(paths), "files": {p: reasons.get(p, "unusable") for p in paths}}, indent=1)
    )
    return report


# --------------------------------------------------------------------------------------------------
# numerics helpers
# --------------------------------------------------------------------------------------------------
PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}")
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("fp16 needs CUDA; use fp32 or bf16 on CPU")
    return precision


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast context for a resolved precision ("fp32" -> no autocast)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=parse_dtype(precision))


def make_grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler, enabled only for fp16."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def no_sync(model: torch.nn.Module, active: bool) -> contextlib.AbstractContextManager:
    """DDP's no_sync() for accumulation micro-steps (no-op without DDP)."""
    if active and isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def clip_and_step(
    params: Sequence[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    scheduler: Any,
    max_grad_norm: float | None,
) -> float:
    """Unscale, clip (when max_grad_norm > 0), step the optimizer and scheduler, zero the grads.

    Returns the grad norm before clipping (nan when not computed).
    """
    scaler.unscale_(optimizer)
    if max_grad_norm and max_grad_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # a DTensor when sharded
    else:
        norm = float("nan")
    scaler.step(optimizer)
    scaler.update()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


def wrap_ddp(module: torch.nn.Module, env: DistEnv, **kwargs) -> torch.nn.Module:
    """DistributedDataParallel around ``module`` (already on env.device) when distributed."""
    if not env.distributed:
        return module
    ids = [env.device.index] if env.device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=ids, **kwargs)


# --------------------------------------------------------------------------------------------------
# logging
# --------------------------------------------------------------------------------------------------
class RunLogger:
    """``RUN/log.jsonl`` (one JSON object per call), TensorBoard in ``RUN/tb``, tqdm; rank 0 only.

    On a resume the log is first cut back to the checkpoint's step so no step appears twice.
    """

    def __init__(self, run: RunDir, env: DistEnv, *, total_steps: int, start_step: int, progress: bool = True):
        self.run, self.env = run, env
        self._file = None
        self._tb = None
        self._bar = None
        if not env.is_main:
            return
        run.truncate_log(start_step)
        self._file = open(run.log_path, "a")
        from torch.utils.tensorboard import SummaryWriter

        self._tb = SummaryWriter(log_dir=str(run.tb), purge_step=start_step + 1 if start_step > 0 else None)
        if progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, dynamic_ncols=True, desc=run.root.name)

    def log(self, step: int, values: Mapping[str, Any], *, prefix: str = "train") -> None:
        if not self.env.is_main:
            return
        record = {"step": int(step), **{k: _plain(v) for k, v in values.items()}, "time": round(time.time(), 3)}
        assert self._file is not None
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        for k, v in record.items():
            if k in ("step", "time") or not isinstance(v, (int, float)) or isinstance(v, bool):
                continue
            if math.isfinite(v):
                self._tb.add_scalar(f"{prefix}/{k}", v, step)  # type: ignore[union-attr]

    def info(self, message: str) -> None:
        """A human-readable line (stderr through tqdm, so it does not break the progress bar)."""
        if not self.env.is_main:
            return
        from tqdm.auto import tqdm

        tqdm.write(f"[{self.run.root.name}] {message}", file=sys.stderr)

    def advance(self, step: int, postfix: Mapping[str, Any] | None = None) -> None:
        if self._bar is not None:
            self._bar.n = step
            if postfix:
                self._bar.set_postfix({k: f"{v:.4g}" if isinstance(v, float) else v for k, v in postfix.items()})
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
        if self._file is not None:
            self._file.close()
        self._bar = self._tb = self._file = None

    def __enter__(self) -> "RunLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _plain(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    return v


def read_log(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of ``RUN/log.jsonl``."""
    path = Path(run_dir) / LOG_NAME
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --------------------------------------------------------------------------------------------------
# when to checkpoint, and how long is left
# --------------------------------------------------------------------------------------------------
DEFAULT_SAVE_EVERY_MINUTES = 5.0  # the recipes' --save-every-minutes


class CheckpointSchedule:
    """When a recipe writes a checkpoint: every ``every_steps`` steps, once ``every_minutes`` of wall time
    have passed since the last checkpoint (or since this process started training; 0: never by time),
    and at ``max_steps``. Call :meth:`due` after each step and :meth:`saved` after writing.

    Rank 0's clock decides the time-based ones and the decision is broadcast, so every rank checkpoints
    at the same step. ``clock`` (seconds, monotonic) is injectable for tests.
    """

    def __init__(self, env: DistEnv, *, max_steps: int, every_steps: int, every_minutes: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        if every_steps < 1:
            raise ValueError("save_every must be >= 1")
        if not every_minutes >= 0:
            raise ValueError(f"save_every_minutes must be >= 0, got {every_minutes}")
        self.env, self.max_steps, self.every_steps = env, max_steps, every_steps
        self.every_s, self.clock = every_minutes * 60.0, clock
        self._last = clock()

    def due(self, step: int) -> bool:
        if step % self.every_steps == 0 or step >= self.max_steps:
            return True
        if self.every_s <= 0:
            return False
        late = self.clock() - self._last >= self.every_s
        if self.env.distributed:
            flag = broadcast_(torch.tensor([1.0 if late else 0.0], device=self.env.device), self.env)
            late = bool(flag.item() > 0)
        return late

    def saved(self) -> None:
        self._last = self.clock()


class Progress:
    """Steps per second since this process started training, and the time left at that rate."""

    def __init__(self, start_step: int, max_steps: int, clock: Callable[[], float] = time.monotonic):
        self.start_step, self.max_steps, self.clock = start_step, max_steps, clock
        self._t0 = clock()

    def elapsed_s(self) -> float:
        return self.clock() - self._t0

    def line(self, step: int) -> str:
        """``step 120/600 (20%), 0.71 steps/s, about 11 min left (ends about 14:12)``."""
        done = step - self.start_step
        head = f"step {step}/{self.max_steps} ({100 * step // self.max_steps}%)"
        elapsed = self.elapsed_s()
        if done <= 0 or elapsed <= 0:
            return head
        rate = done / elapsed
        left_s = (self.max_steps - step) / rate
        ends = datetime.datetime.now() + datetime.timedelta(seconds=left_s)
        return f"{head}, {rate:.3g} steps/s, about {format_duration(left_s)} left (ends about {ends:%H:%M})"


def format_duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``2.5 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# --------------------------------------------------------------------------------------------------
# the parts every recipe's step loop shares: the run around the steps, and the logged windows
# --------------------------------------------------------------------------------------------------
class TrainingRun:
    """One invocation of a recipe on RUN/, around its own step loop: the resume from the newest readable
    checkpoint (said in the log), checkpoints on a :class:`CheckpointSchedule` (each with the time left,
    :class:`Progress`), and at the end a summary line and ``RUN/final`` (written to a temp folder on rank 0,
    then renamed). ``log`` is the run's :class:`RunLogger`; ``resumed.extra`` the recipe's own saved state.

    A write that fails during the run (a checkpoint, RUN/final or the log on a full disk) ends it with one
    line, ``SystemExit("error: cannot write checkpoint step-... in FOLDER: disk full (...); it needs about
    N, M free. The last good checkpoint, ..., is kept: ...")`` (exit status 1), on every rank; the partial
    file is gone and a re-run resumes from that checkpoint.

        with loop.TrainingRun(run, state, max_steps=N, save_every=..., seed=...) as tr:
            step = tr.start
            while step < N:
                ...; step += 1                                    # one optimizer step
                if tr.checkpoint_due(step):
                    tr.save(step, extra={...})
            tr.finish(step, write_final)                          # write_final(folder) on rank 0
    """

    def __init__(self, run: RunDir, state: TrainingState, *, max_steps: int, save_every: int,
                 save_every_minutes: float = 0.0, keep: int = 3, seed: int = 0, progress: bool = True,
                 clock: Callable[[], float] = time.monotonic):
        self.run, self.state, self.env = run, state, state.env
        self.max_steps, self.save_every, self.save_every_minutes = max_steps, save_every, save_every_minutes
        self.seed, self.show_progress, self.clock = seed, progress, clock
        self.ckpts = CheckpointManager(run.checkpoints, self.env, keep=keep)

    @classmethod
    def for_loop(cls, run: RunDir, state: TrainingState, cfg: "LoopConfig",
                 clock: Callable[[], float] = time.monotonic) -> "TrainingRun":
        """The run of a loop configured by ``cfg`` (:func:`loop_config`)."""
        return cls(run, state, max_steps=cfg.max_steps, save_every=cfg.save_every,
                   save_every_minutes=cfg.save_every_minutes, keep=cfg.keep_checkpoints, seed=cfg.seed,
                   progress=cfg.progress, clock=clock)

    def __enter__(self) -> "TrainingRun":
        try:
            self._start()
        except OSError as e:
            stop = self._disk_exit(e)
            if stop is None:
                raise
            raise stop from None
        return self

    def _start(self) -> None:
        """Resume, open the log, and start the checkpoint schedule and the progress clock."""
        self.resumed = resume(self.ckpts, self.state, self.seed)
        self.start = self.resumed.step
        self.log = RunLogger(self.run, self.env, total_steps=self.max_steps, start_step=self.start,
                             progress=self.show_progress)
        stream = self.state.stream
        if self.start:
            self.log.info(f"resumed from step {self.start} (epoch {stream.epoch}, batch {stream.index})")
        for note in self.resumed.notes:
            self.log.info(note)
        if self.start >= self.max_steps:
            self.log.info(f"already at step {self.start} >= --max-steps {self.max_steps}")
        self.schedule = CheckpointSchedule(self.env, max_steps=self.max_steps, every_steps=self.save_every,
                                           every_minutes=self.save_every_minutes, clock=self.clock)
        self.progress = Progress(self.start, self.max_steps, clock=self.clock)

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: Any) -> None:
        try:
            self.log.close()
        except OSError:
            if exc is None:
                raise  # a failing close while another error propagates would only hide that one
        stop = self._disk_exit(exc) if exc is not None else None
        if stop is not None:
            raise stop from None

    def _disk_exit(self, exc: BaseException) -> SystemExit | None:
        """The one-line exit for a write that failed during the run (None for any other error)."""
        if isinstance(exc, WriteFailedError):
            message = str(exc)
        elif isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:  # e.g. appending to the log
            message = f"cannot write in {self.run.root}: disk full ({exc.strerror})"
        else:
            return None
        return SystemExit(f"error: {message}. {self.ckpts.last_good_note()}")

    def checkpoint_due(self, step: int) -> bool:
        """Whether ``step`` ends with a checkpoint (the same answer on every rank)."""
        return self.schedule.due(step)

    def save(self, step: int, extra: Mapping[str, Any] | None = None) -> None:
        """The checkpoint of ``step`` (every rank calls it), and the time left."""
        state = self.state
        sharded = {"write_sharded": state.write_sharded} if state.sharded else {}
        path = self.ckpts.save(step, state.state_dict(step, extra), **sharded)
        self.schedule.saved()
        if step < self.max_steps and path is not None:
            self.log.info(f"checkpoint {path.name}; {self.progress.line(step)}")

    def finish(self, step: int, write_final: Callable[[Path], None] | None) -> None:
        """The summary line; then ``write_final(folder)`` on rank 0 makes ``RUN/final`` (unless a finished
        run was only re-run)."""
        if step > self.start:
            self.log.info(f"trained steps {self.start + 1}-{step} in {format_duration(self.progress.elapsed_s())}")
        if write_final is None or (self.start >= self.max_steps and self.run.final.exists()):
            return

        def write() -> None:
            with atomic_folder(self.run.final, what="model folder") as tmp:
                write_final(tmp)
            self.log.info(f"wrote {self.run.final}")

        main_rank_write(self.env, write)


class MetricWindow:
    """The per-step metrics of the steps between two log lines, reduced to one log record.

    A key a step lacks is left out of that step; ``last`` keys take their value at the newest step,
    ``summed`` keys their sum over the window, the others their mean. With ``over_ranks`` the record is
    then the mean over ranks (one all-reduce: every rank calls :meth:`record`); metrics that already
    agree on every rank turn it off. Values that are not finite are left out of the record.
    """

    def __init__(self, env: DistEnv, *, last: Sequence[str] = (), summed: Sequence[str] = (),
                 over_ranks: bool = True):
        self.env, self.last, self.summed, self.over_ranks = env, tuple(last), tuple(summed), over_ranks
        self.rows: list[Mapping[str, float]] = []
        self.steps_per_s = math.nan  # of the last recorded window
        self._t0 = time.perf_counter()

    def add(self, stats: Mapping[str, float]) -> None:
        self.rows.append(stats)

    def __len__(self) -> int:
        return len(self.rows)

    def record(self) -> dict[str, float]:
        """The window's record; a new window starts."""
        keys = list(dict.fromkeys(k for row in self.rows for k in row))
        local = torch.tensor([[float(row.get(k, math.nan)) for k in keys] for row in self.rows], dtype=torch.float64)
        reduced = local.nanmean(0)  # a key missing from every step of the window stays nan
        for i, k in enumerate(keys):
            if k in self.last:
                reduced[i] = local[-1, i]
            elif k in self.summed:
                reduced[i] = local[:, i].nansum()
        if self.over_ranks:
            reduced = all_reduce_sum(reduced, self.env) / self.env.world_size
        self.steps_per_s = len(self.rows) / (time.perf_counter() - self._t0)
        self.rows, self._t0 = [], time.perf_counter()
        return {k: float(reduced[i]) for i, k in enumerate(keys) if math.isfinite(reduced[i])}


# --------------------------------------------------------------------------------------------------
# the loop settings, and the step of the recipes whose step is one objective (training.vqvae, training.sft)
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoopConfig:
    max_steps: int
    save_every: int = 500
    save_every_minutes: float = 0.0  # also checkpoint when this much wall time has passed (0: off)
    val_every: int = 0  # 0: validate only at the end
    log_every: int = 10
    keep_checkpoints: int = 3
    max_grad_norm: float = 2.0
    grad_accum: int = 1
    precision: str = "fp32"  # resolved: fp32 | bf16 | fp16
    progress: bool = True
    seed: int = 0

    def __post_init__(self):
        if self.max_steps < 1:
            raise ValueError("max_steps must be >= 1")
        if self.save_every < 1:
            raise ValueError("save_every must be >= 1")
        if not self.save_every_minutes >= 0:
            raise ValueError("save_every_minutes must be >= 0")
        if self.log_every < 1:
            raise ValueError("log_every must be >= 1")

    def log_due(self, step: int) -> bool:
        """Whether ``step`` ends a log window (every ``log_every`` steps, and the last step)."""
        return step % self.log_every == 0 or step == self.max_steps

    def val_due(self, step: int) -> bool:
        """Whether to validate after ``step`` inside the loop (every ``val_every`` steps; the end is the
        recipe's own validation after the loop)."""
        return bool(self.val_every) and step % self.val_every == 0 and step != self.max_steps


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




# --------------------------------------------------------------------------------------------------
# command-line options every recipe shares
# --------------------------------------------------------------------------------------------------
# options that may change when a run is resumed (they do not change what is computed)
FREE_KEYS = ("out", "save_every", "save_every_minutes", "keep_checkpoints", "log_every", "num_workers", "no_progress",
             "device", "val_every", "val_batch_size", "val_max_batches")


DATA_HELP = "triplet manifest, folder (manifest.jsonl or shards), shard tar or pattern; repeatable"


def recipe_parser(module: str, doc: str, *, data_help: str = DATA_HELP) -> argparse.ArgumentParser:
    """The parser of ``python -m MODULE`` (its description: the first line of ``doc``), with the repeatable
    --data; the recipe adds its own options, then :func:`add_loop_args`."""
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", action="append", required=True, help=data_help)
    return p


def add_loop_args(parser, *, lr: float, batch_size: int, max_grad_norm: float = 2.0) -> None:
    """--out --max-steps --batch-size --grad-accum --lr --warmup-steps ... (see --help)."""
    g = parser.add_argument_group("run and loop")
    g.add_argument("--out", required=True, help="RUN directory; re-running the same command resumes it")
    g.add_argument("--max-steps", type=int, required=True, help="optimizer steps in all")
    g.add_argument("--batch-size", type=int, default=batch_size,
                   help="global batch: samples per optimizer step over all processes and accumulation steps")
    g.add_argument("--grad-accum", type=int, default=1, help="micro-steps per optimizer step")
    g.add_argument("--lr", type=float, default=lr, help="peak learning rate (AdamW)")
    g.add_argument("--warmup-steps", type=int, default=0, help="linear learning-rate warm-up steps")
    g.add_argument("--weight-decay", type=float, default=0.05, help="AdamW weight decay")
    g.add_argument("--max-grad-norm", type=float, default=max_grad_norm, help="0 disables clipping")
    g.add_argument("--save-every", type=int, default=500, help="checkpoint every N steps (and at the end)")
    g.add_argument("--save-every-minutes", type=float, default=DEFAULT_SAVE_EVERY_MINUTES, metavar="M",
                   help="also checkpoint once M minutes have passed since the last checkpoint (0: only by steps)")
    g.add_argument("--keep-checkpoints", type=int, default=3, help="step checkpoints kept in RUN/checkpoints (older ones deleted)")
    g.add_argument("--log-every", type=int, default=10, help="steps between lines of RUN/log.jsonl and TensorBoard")
    g.add_argument("--val-every", type=int, default=0, help="validate every N steps (0: only at the end)")
    g.add_argument("--seed", type=int, default=0, help="seed of the model initialisation, the data order and sampling")
    g.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes per rank")
    g.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    g.add_argument("--precision", choices=PRECISIONS, default="auto", help="auto: bf16 autocast on CUDA, fp32 on CPU")
    g.add_argument("--no-progress", action="store_true", help="no tqdm bar")


def loop_config(args, precision: str) -> LoopConfig:
    return LoopConfig(
        max_steps=args.max_steps,
        save_every=args.save_every,
        save_every_minutes=args.save_every_minutes,
        val_every=args.val_every,
        log_every=args.log_every,
        keep_checkpoints=args.keep_checkpoints,
        max_grad_norm=args.max_grad_norm,
        grad_accum=args.grad_accum,
        precision=precision,
        progress=not args.no_progress,
        seed=args.seed,
    )


def move_to(batch: Any, device: torch.device) -> Any:
    """Tensors in (nested) dicts, lists and tuples moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: move_to(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to(v, device) for v in batch)
    return batch
