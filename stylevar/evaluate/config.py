"""What an evaluation is asked to do (EvalConfig), what it returns (RunResult), and its result columns."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from stylevar.metrics.definitions import METRICS, NAMES, PAPER_METRICS

SPLITS = ("val", "train", "all")
TIME = "seconds_per_image"  # the column of each method's own inference time
MISSING = "missing"  # the value of a metric (or method) whose weights are not present


@dataclass(frozen=True)
class EvalConfig:
    methods: tuple[str, ...]  # model directories, hub ids or stylevar.evaluate.methods.BUILTIN_METHODS
    benchmarks: tuple[tuple[str, str], ...]  # (name, manifest file or folder holding manifest.jsonl)
    out: str
    n: int = 50
    seed: int = 42
    metrics: tuple[str, ...] = PAPER_METRICS
    split: str = "val"  # val | train | all
    device: str | None = None  # default: cuda if available
    allow_missing: bool = False
    batch_size: int = 4
    lpips_net: str = "vgg"
    image_size: int = 256  # the paper's 256; smaller only for smoke tests
    grid_rows: int = 4
    warmup: bool = True  # one untimed call per method and benchmark before timing
    progress: bool = True

    def __post_init__(self) -> None:
        if not self.methods:
            raise ValueError("give at least one --method")
        if not self.benchmarks:
            raise ValueError("give at least one --benchmark NAME=MANIFEST_OR_ROOT")
        names = [b for b, _ in self.benchmarks]
        if len(set(names)) != len(names):
            raise ValueError(f"benchmark names must be unique, got {names}")
        if self.n < 1 or self.batch_size < 1 or self.image_size < 32 or self.grid_rows < 0:
            raise ValueError("--n and --batch-size must be >= 1, --image-size >= 32, --grid-rows >= 0")
        if self.split not in SPLITS:
            raise ValueError(f"--split must be one of {SPLITS}, not {self.split!r}")
        for m in self.metrics:
            if m not in METRICS:
                raise ValueError(f"unknown metric {m!r}; choose from {', '.join(NAMES)}")


@dataclass
class RunResult:
    rows: list[dict] = field(default_factory=list)  # one per benchmark x method: means
    samples: list[dict] = field(default_factory=list)  # one per benchmark x method x sample
    files: list[Path] = field(default_factory=list)
    skipped_metrics: dict[str, str] = field(default_factory=dict)  # metric -> missing weight
    skipped_methods: dict[str, str] = field(default_factory=dict)  # method -> missing weight(s)
    shortfalls: list[str] = field(default_factory=list)  # why the tables have fewer rows than asked
    rank: int = 0  # this process's under torchrun: only process 0 writes files


def label(column: str) -> str:
    """A result column's label in tables and charts."""
    return "Time (s)" if column == TIME else METRICS[column].label


def higher_better(column: str) -> bool:
    return False if column == TIME else METRICS[column].higher_is_better
