"""Benchmarks: a triplet manifest's rows of one split, `n` of them drawn with a seed, and their images."""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from stylevar.processing.images import load_image, pil_to_tensor
from stylevar.loaders.manifest import manifest_path, read_manifest


@dataclass(frozen=True)
class Sample:
    index: int  # line number in the manifest (0-based, blank lines skipped)
    id: str
    content: Path
    style: Path
    target: Path | None


@dataclass(frozen=True)
class Benchmark:
    name: str
    manifest: Path
    samples: tuple[Sample, ...]
    paired: bool
    total: int  # rows of the requested split before drawing n


def load_benchmark(name: str, source: str | Path, *, split: str, n: int, seed: int | None) -> Benchmark:
    """A manifest's rows of `split`, `n` drawn with `seed` (None: the first `n`), their files checked."""
    path = manifest_path(source)
    base = path.parent
    rows = [Sample(i, e.id, base / e.content, base / e.style, base / e.target if e.target else None)
            for i, e in enumerate(read_manifest(path)) if split == "all" or e.split == split]
    if not rows:
        raise ValueError(f"benchmark {name}: {path} has no rows in split {split!r} (try --split all)")
    with_target = sum(s.target is not None for s in rows)
    if 0 < with_target < len(rows):
        raise ValueError(f"benchmark {name}: {with_target} of {len(rows)} rows have a target; a benchmark must be "
                         "all paired or all unpaired (split it into two manifests)")
    if len(rows) <= n:
        picked = list(range(len(rows)))
    else:
        picked = list(range(n)) if seed is None else sorted(random.Random(seed).sample(range(len(rows)), n))
    samples = tuple(rows[i] for i in picked)
    absent = [str(p) for s in samples for p in (s.content, s.style, s.target) if p is not None and not p.is_file()]
    if absent:
        raise FileNotFoundError(f"benchmark {name}: {len(absent)} image(s) not found, e.g. {', '.join(absent[:3])}")
    return Benchmark(name, path, samples, paired=with_target > 0, total=len(rows))


def load_tensor(path: Path, size: int) -> torch.Tensor:
    """Image file -> (3, size, size) in [0, 1] (RGB, EXIF-oriented, bicubic resize)."""
    return pil_to_tensor(load_image(path).resize((size, size), Image.BICUBIC))


@dataclass(frozen=True)
class Triplets:
    """A benchmark's images (n, 3, size, size) in [0, 1] (target None when unpaired) and each sample's seed."""

    content: torch.Tensor
    style: torch.Tensor
    target: torch.Tensor | None
    seeds: list[int]

    @classmethod
    def load(cls, bench: Benchmark, size: int, seed: int) -> Triplets:
        content = torch.stack([load_tensor(s.content, size) for s in bench.samples])
        style = torch.stack([load_tensor(s.style, size) for s in bench.samples])
        target = torch.stack([load_tensor(s.target, size) for s in bench.samples]) if bench.paired else None
        return cls(content, style, target, [seed + s.index for s in bench.samples])

    def grid(self, rows: int) -> dict[str, list[torch.Tensor]]:
        """The first ``rows`` content, style (and target) images: the first columns of the samples grid."""
        grid = {"content": list(self.content[:rows]), "style": list(self.style[:rows])}
        if self.target is not None:
            grid["target"] = list(self.target[:rows])
        return grid
