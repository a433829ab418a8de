"""The options of the prepared device run (`python -m benchmarks.device_run`, which takes its defaults from here;
`benchmarks/measures/device_run.py`'s stages read them). No torch: the command's --help stays fast."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DeviceRunConfig:
    """One run's options (the stages in benchmarks/measures/device_run.py read them)."""

    out: Path
    device: str = "cuda"
    preset: str = "d20"
    batch_sizes: tuple[int, ...] = (1, 16, 64)
    compile_backend: str = "inductor"  # "eager": dynamo's graphs without code generation (the CPU dry run)
    repeats: int = 3
    warmup: int = 1
    train_batch: int = 16
    train_variant: str = "eager"  # benchmarks.train_step's variant: eager, or default (blocks compiled)
    requests: int = 64  # concurrent clients of the service
    serve_seconds: float = 20.0  # how long they send back to back
    budget_s: float = 480.0  # the whole run
