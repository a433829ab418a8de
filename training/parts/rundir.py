"""``RUN/``, the folder of one training run: its config check on resume, and its log cut back on resume."""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from stylevar.utils.atomic import WriteFailedError, atomic_write_text, write_failure
from training.parts.checkpoints import checkpoint_paths, remove_stale_temps
from training.parts.distributed import DistEnv, main_rank_write
from training.parts.extension import RunExtension

CONFIG_NAME = "config.json"
LOG_NAME = "log.jsonl"


class RunConfigMismatchError(RuntimeError):
    """The RUN directory belongs to a run with a different configuration."""


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


def with_absent(old: Mapping[str, Any], absent_as: Mapping[str, Any]) -> dict[str, Any]:
    """``old`` with the keys of ``absent_as`` it lacks ("section.key": inside a section) set to their value."""
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in old.items()}
    for dotted, value in absent_as.items():
        section, _, key = dotted.rpartition(".")
        where = out.get(section) if section else out
        if isinstance(where, dict) and key not in where:
            where[key] = value
    return out


def config_differences(old: Mapping[str, Any], new: Mapping[str, Any], free_keys: Sequence[str],
                       absent_as: Mapping[str, Any] | None = None) -> str:
    """``key: old -> new`` per differing key outside ``free_keys`` ("" when none), after `with_absent`."""
    old = with_absent(old, absent_as or {})
    keys = (set(old) | set(new)) - set(free_keys)
    diff = sorted(k for k in keys if old.get(k, "<absent>") != new.get(k, "<absent>"))
    return ", ".join(f"{k}: {old.get(k, '<absent>')!r} -> {new.get(k, '<absent>')!r}" for k in diff)


@dataclass(frozen=True)
class RunDir:
    """``RUN/``: config.json, log.jsonl, tb/, checkpoints/, final/. From :meth:`prepare`, ``config`` is what
    config.json holds and ``notes`` the lines worth logging about it (a learning-rate drop kept)."""

    root: Path
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)
    notes: tuple[str, ...] = ()

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
    def prepare(cls, root: str | os.PathLike, config: Mapping[str, Any], env: DistEnv, *, free_keys: Sequence[str] = (),
                absent_as: Mapping[str, Any] | None = None, extension: RunExtension | None = None) -> "RunDir":
        """Create RUN/ and write its config, or check that an existing run has the same one (only ``free_keys``
        may differ; ``absent_as``: older runs' values of newer options; ``extension``: a run trained longer).
        Every rank checks, rank 0 writes; a failed write (disk full) exits with one line (SystemExit)."""
        run, new, notes = cls(Path(root)), _jsonable(dict(config)), ()
        old_text = run.config_path.read_text() if run.config_path.exists() else None
        if old_text is not None:
            try:
                old = json.loads(old_text)
            except json.JSONDecodeError as e:
                raise RunConfigMismatchError(f"{run.config_path} is not valid JSON ({e}); use a new --out") from e
            new, notes = run._check_same_run(old, new, free_keys, absent_as, extension)
        text = json.dumps(new, indent=1, sort_keys=True) + "\n"
        run = cls(run.root, new, notes)
        env.barrier()
        try:
            main_rank_write(env, lambda: run._write_config(text, old_text))
        except WriteFailedError as e:
            raise SystemExit(f"error: {e}") from None
        return run

    def _check_same_run(self, old: Mapping[str, Any], new: Mapping[str, Any], free_keys: Sequence[str],
                        absent_as: Mapping[str, Any] | None,
                        extension: RunExtension | None) -> tuple[dict[str, Any], tuple[str, ...]]:
        """The config ``new`` continues ``old`` with, and notes; RunConfigMismatchError unless it may."""
        extendable = extension.keys if extension is not None else ()
        lines = config_differences(old, new, (*free_keys, *extendable), absent_as)
        if lines:
            raise RunConfigMismatchError(f"{self.root} holds a run with a different configuration ({lines}). "
                                         "Re-run the same command to resume it, or choose a new --out.")
        if extension is None:
            return dict(new), ()
        done = max((step for step, _ in checkpoint_paths(self.checkpoints)), default=0)
        old = with_absent(old, absent_as or {})
        settled, note = extension.settle(old, new, done)
        problem = extension.problem(old, settled, done)
        if problem:
            raise RunConfigMismatchError(f"{self.root} cannot be continued with these options: {problem}, "
                                         "or choose a new --out.")
        return settled, (note,) if note else ()

    def _write_config(self, text: str, old_text: str | None) -> None:
        """Remove stale temporary files, make ``checkpoints/``, write config.json unless unchanged."""
        remove_stale_temps(self.root, ".*.tmp")
        remove_stale_temps(self.checkpoints)
        try:
            self.checkpoints.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise write_failure(self.checkpoints, e) from e
        if text != old_text:
            atomic_write_text(self.config_path, text)

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

