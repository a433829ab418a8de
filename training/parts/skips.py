"""The image files a run passed over (missing or undecodable): collected over ranks, reported in
``RUN/skipped.json``."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from stylevar.utils.atomic import atomic_write_text
from training.parts.distributed import DistEnv, all_gather_object
from training.parts.rundir import RunDir


class SkipTracker:
    """Collects the ``skipped`` file lists of batches (every rank) for the log and a final report."""

    def __init__(self, env: DistEnv):
        self.env = env
        self.paths: set[str] = set()

    def take(self, batch: dict[str, Any]) -> dict[str, Any]:
        self.paths.update(batch.pop("skipped", []))
        return batch

    def all_paths(self) -> list[str]:
        """Every rank's skipped files, sorted (every rank calls it)."""
        gathered = all_gather_object(sorted(self.paths), self.env)
        return sorted({p for part in gathered for p in part})

    def report(self, run: RunDir, reasons: Mapping[str, str]) -> None:
        """``RUN/skipped.json`` (rank 0) and a line on stderr when files were skipped (every rank calls it)."""
        skipped = self.all_paths()
        if self.env.is_main:
            path = write_skip_report(run, skipped, dict(reasons))
            if skipped:
                print(f"skipped {len(skipped)} unusable image file(s); see {path}", file=sys.stderr)


def write_skip_report(run: RunDir, paths: Sequence[str], reasons: dict[str, str]) -> Path:
    report = run.root / "skipped.json"
    atomic_write_text(
        report, json.dumps({"count": len(paths), "files": {p: reasons.get(p, "unusable") for p in paths}}, indent=1)
    )
    return report
