"""``RUN/checkpoints/step-XXXXXXXX.pt``: written atomically by rank 0, the newest ``keep`` kept, read back
newest first with unreadable files set aside (renamed ``*.pt.corrupt``) and reported."""
from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from stylevar.utils.atomic import WriteFailedError, atomic_write, fsync_dir, remove_quietly
from training.parts.distributed import DistEnv, main_rank_write


class CheckpointsUnreadableError(RuntimeError):
    """``RUN/checkpoints`` holds checkpoints, but none of them can be read (the message names each)."""


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
    """A checkpoint dict from ``path``; :class:`CorruptCheckpointError` for any damaged file."""
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
        """Write ``state`` for ``step`` on rank 0 (``write_sharded(folder)`` first on every rank). A failed write
        raises :class:`WriteFailedError` on every rank and leaves nothing of this step; pruning comes after."""
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
        """The newest readable checkpoint (``state`` None on a fresh run). Newer unreadable files are reported in
        ``skipped`` and renamed ``*.pt.corrupt``; none readable: :class:`CheckpointsUnreadableError`."""
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
            for b in bad:  # a rename of a file already there, not a write: nothing for stylevar.utils.atomic to do
                os.replace(b.path, b.set_aside_as)
            fsync_dir(self.dir)
        self.env.barrier()


def remove_stale_temps(folder: Path, pattern: str = ".step-*.tmp") -> None:
    """Remove the temporary files a killed process's writes left in ``folder`` (they would keep a disk full)."""
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
