"""What a run says: ``RUN/log.jsonl`` (one JSON object per logged step), TensorBoard in ``RUN/tb``, a tqdm
bar and human-readable lines (rank 0 only), and the window of per-step metrics each log line reduces."""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from training.parts.distributed import DistEnv, all_reduce_sum
from training.parts.rundir import LOG_NAME, RunDir


class RunLogger:
    """``RUN/log.jsonl``, TensorBoard in ``RUN/tb``, tqdm; rank 0 only. A resume cuts the log back to its step."""

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


class MetricWindow:
    """The metrics of the steps between two log lines as one record (``last``: newest value, ``summed``: sum)."""

    def __init__(self, env: DistEnv, *, last: Sequence[str] = (), summed: Sequence[str] = (), over_ranks: bool = True):
        self.env, self.last, self.summed, self.over_ranks = env, tuple(last), tuple(summed), over_ranks
        self.rows: list[Mapping[str, float]] = []
        self.steps_per_s = math.nan  # of the last recorded window
        self._t0 = time.perf_counter()

    def add(self, stats: Mapping[str, float | torch.Tensor]) -> None:
        self.rows.append(stats)

    def __len__(self) -> int:
        return len(self.rows)

    def record(self) -> dict[str, float]:
        """The window's record; a new window starts."""
        keys = list(dict.fromkeys(k for row in self.rows for k in row))
        local = _host_table(self.rows, keys)
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


def _host_table(rows: Sequence[Mapping[str, float | torch.Tensor]], keys: Sequence[str]) -> torch.Tensor:
    """(rows, keys) float64 on the CPU, nan where a row lacks a key; one copy per device."""
    table = torch.full((len(rows), len(keys)), math.nan, dtype=torch.float64)
    by_device: dict[torch.device, list[tuple[int, int, torch.Tensor]]] = {}
    for i, row in enumerate(rows):
        for j, k in enumerate(keys):
            v = row.get(k)
            if isinstance(v, torch.Tensor):
                by_device.setdefault(v.device, []).append((i, j, v.detach().reshape(())))
            elif v is not None:
                table[i, j] = float(v)
    for cells in by_device.values():
        values = torch.stack([v.to(torch.float64) for _, _, v in cells]).cpu()
        for (i, j, _), value in zip(cells, values):
            table[i, j] = value
    return table
