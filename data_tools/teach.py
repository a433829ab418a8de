"""Teacher triplets: content photographs re-drawn by a pretrained stylizer, as OmniStyle-150K was made.

Triplet i comes from (seed, i) alone; the teacher (`stylevar.baselines.magenta`) paints at 384 px, shrunk to
`--size`; targets whose edges no longer follow the content's are dropped. Rank r of W makes the items
i % W == r, logged to `OUT/parts/` so a killed run resumes; the last rank (or `--merge`) writes the manifest.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
from PIL import Image

from stylevar.cli.command import Parser

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")
SOURCES_FILE = "SOURCES.json"
UNKNOWN_SOURCE = {"source": "unknown", "licence": "unknown"}


@dataclass(frozen=True)
class TeachConfig:
    contents: Path
    styles: Path
    out: Path
    size: int = 64
    count: int = 1000
    seed: int = 0
    val_fraction: float = 0.05
    min_edge_corr: float = 0.3
    content_crop: tuple[float, float] = (0.45, 1.0)  # crop side as a fraction of the picture's shorter side
    style_crop: tuple[float, float] = (0.35, 1.0)
    photo_styles: float = 0.0  # share of the triplets whose style is a content photograph (not their own)
    rank: int = 0
    world_size: int = 1
    threads: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank {self.rank} of {self.world_size}")
        if self.size < 8:
            raise ValueError(f"size must be at least 8, not {self.size}")
        if self.count < 1:
            raise ValueError(f"count must be at least 1, not {self.count}")
        if not 0 <= self.photo_styles <= 1:
            raise ValueError(f"photo_styles must be in [0, 1], not {self.photo_styles}")

    @property
    def log_path(self) -> Path:
        return self.out / "parts" / f"rank-{self.rank}-of-{self.world_size}.jsonl"


@dataclass(frozen=True)
class Picture:
    path: Path
    name: str      # relative to its folder: the key of sources.json
    source: dict
    image: Image.Image  # decoded once, when the folder is scanned


def _sources(folder: Path) -> dict:
    f = folder / SOURCES_FILE
    return json.loads(f.read_text(encoding="utf-8")) if f.is_file() else {}


def listed_pictures(folder: Path, role: str) -> list[tuple[str, Path, dict]]:
    """(name, path, source) of every picture file under `folder`, sorted, without decoding them."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{role} folder not found: {folder}")
    sources = _sources(folder)
    paths = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    return [(p.relative_to(folder).as_posix(), p, sources.get(p.relative_to(folder).as_posix(), UNKNOWN_SOURCE))
            for p in paths]


def scan_pictures(folder: Path, role: str) -> list[Picture]:
    """Every decodable picture under `folder` (sorted), decoded; one stderr line per file that is not."""
    from stylevar.processing.images import load_image
    pictures = []
    for name, path, source in listed_pictures(folder, role):
        try:
            image = load_image(path)
        except Exception as e:  # a corrupt picture costs one line, never the run
            print(f"[teach] skipped {role} {path}: {e}", file=sys.stderr)
            continue
        pictures.append(Picture(path, name, source, image))
    if not pictures:
        raise FileNotFoundError(f"no readable {role} pictures in {folder}")
    return pictures


def _square_crop(img: Image.Image, rng: np.random.Generator, frac: tuple[float, float]) -> Image.Image:
    side = max(1, int(min(img.size) * rng.uniform(*frac)))
    left = int(rng.integers(0, img.width - side + 1))
    top = int(rng.integers(0, img.height - side + 1))
    crop = img.crop((left, top, left + side, top + side))
    return crop.transpose(Image.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else crop


def _shrink(img: Image.Image, size: int) -> Image.Image:
    return img.resize((size, size), Image.LANCZOS, reducing_gap=3.0)


def _item_split(cfg: TeachConfig, i: int) -> str:
    return "val" if random.Random(f"{cfg.seed}-split-{i}").random() < cfg.val_fraction else "train"


def _read_log(path: Path) -> dict[int, dict]:
    """Finished items by index; a line cut short by a kill is ignored (that item is made again)."""
    done = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            done[int(rec["index"])] = rec
    return done


class Teacher:
    """Makes and stores one triplet at a time."""

    def __init__(self, cfg: TeachConfig) -> None:
        from stylevar.baselines.magenta import MagentaConfig, MagentaStylizer
        self.cfg = cfg
        self.contents = scan_pictures(cfg.contents, "content")
        self.styles = scan_pictures(cfg.styles, "style")
        self.stylizer = MagentaStylizer(MagentaConfig(threads=cfg.threads))

    def triplet(self, i: int, size: int) -> tuple[Image.Image, Image.Image, Image.Image, dict]:
        """Triplet i at `size` px (content, style, target) and the names of its two pictures."""
        rng = np.random.default_rng([self.cfg.seed, i])
        c = int(rng.integers(len(self.contents)))
        content_p = self.contents[c]
        if self.cfg.photo_styles > 0 and len(self.contents) > 1 and rng.random() < self.cfg.photo_styles:
            style_p = self.contents[(c + 1 + int(rng.integers(len(self.contents) - 1))) % len(self.contents)]
        else:
            style_p = self.styles[int(rng.integers(len(self.styles)))]
        content_crop = _square_crop(content_p.image, rng, self.cfg.content_crop)
        style_crop = _square_crop(style_p.image, rng, self.cfg.style_crop)
        painted = self.stylizer.transform(_shrink(content_crop, self.stylizer.config.content_size),
                                          self.stylizer.style_vector(style_crop))
        content, style, target = (_shrink(x, size) for x in (content_crop, style_crop, painted))
        return content, style, target, {"content": content_p.name, "style": style_p.name}

    def make(self, i: int) -> dict:
        from stylevar.processing.images import pil_to_tensor
        from stylevar.metrics.structure import edge_correlation
        cfg = self.cfg
        content, style, target, names = self.triplet(i, cfg.size)
        edge = float(edge_correlation(pil_to_tensor(target)[None], pil_to_tensor(content)[None])[0])
        rec = {"index": i, "id": f"{i:06d}", "edge_corr": round(edge, 4), "sources": names}
        if edge < cfg.min_edge_corr:
            return {**rec, "kept": False}
        from stylevar.utils.atomic import atomic_write_path
        for role, img in (("content", content), ("style", style), ("target", target)):
            path = cfg.out / role / f"{rec['id']}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_path(path, lambda tmp, img=img: img.save(tmp, format="PNG"), what=f"{role} image")
        return {**rec, "kept": True, "split": _item_split(cfg, i)}


def _source_of(sources: dict, role: str, name: str) -> dict:
    """A style may be a content photograph (`photo_styles`): its record is then the photograph's."""
    return sources[role].get(name) or sources["content"].get(name, UNKNOWN_SOURCE)


def _append(path: Path, rec: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())


def merge(cfg: TeachConfig) -> Path:
    """Write OUT/manifest.jsonl and OUT/sources.json from every rank's log (kept items, in index order)."""
    from stylevar.utils.atomic import atomic_write_text
    records: dict[int, dict] = {}
    for log in sorted((cfg.out / "parts").glob("rank-*.jsonl")):
        records.update(_read_log(log))
    sources = {"content": {name: src for name, _, src in listed_pictures(cfg.contents, "content")},
               "style": {name: src for name, _, src in listed_pictures(cfg.styles, "style")}}
    lines = []
    for i in sorted(records):
        rec = records[i]
        if not rec.get("kept"):
            continue
        entry = {role: f"{role}/{rec['id']}.png" for role in ("content", "style", "target")}
        entry.update(split=rec["split"], id=rec["id"], edge_corr=rec["edge_corr"], sources={
            role: {"file": name, **_source_of(sources, role, name)} for role, name in rec["sources"].items()
        })
        lines.append(json.dumps(entry, ensure_ascii=False))
    atomic_write_text(cfg.out / "sources.json", json.dumps(sources, indent=1, ensure_ascii=False) + "\n",
                      what="sources")
    return atomic_write_text(cfg.out / "manifest.jsonl", "".join(line + "\n" for line in lines), what="manifest")


def run(cfg: TeachConfig, progress: bool = True) -> Path | None:
    """Make this rank's items (skipping those its log holds); returns the manifest once every rank is done."""
    from tqdm import tqdm
    cfg.log_path.parent.mkdir(parents=True, exist_ok=True)
    done = _read_log(cfg.log_path)
    todo = [i for i in range(cfg.rank, cfg.count, cfg.world_size) if i not in done]
    if todo:
        teacher = Teacher(cfg)
        for i in tqdm(todo, desc=f"teach rank {cfg.rank}", disable=not progress):
            _append(cfg.log_path, teacher.make(i))
    finished = cfg.log_path.with_suffix(".done")
    finished.touch()
    ranks = [cfg.out / "parts" / f"rank-{r}-of-{cfg.world_size}.done" for r in range(cfg.world_size)]
    return merge(cfg) if all(p.exists() for p in ranks) else None


def _fraction_range(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(",")
    lo_f, hi_f = float(lo), float(hi or lo)
    if not 0 < lo_f <= hi_f <= 1:
        raise argparse.ArgumentTypeError(f"expected LO,HI with 0 < LO <= HI <= 1, not {text!r}")
    return lo_f, hi_f


def parse_args(argv: list[str] | None = None) -> tuple[TeachConfig, argparse.Namespace]:
    p = Parser(prog="python -m data_tools.teach", description=__doc__.split("\n\n")[0])
    p.add_argument("--contents", type=Path, required=True, help="folder of content photographs")
    p.add_argument("--styles", type=Path, required=True, help="folder of style pictures")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--size", type=int, default=64, help="side of the stored square images, px")
    p.add_argument("--count", type=int, default=1000, help="triplets to attempt (before filtering)")
    p.add_argument("--seed", type=int, default=0, help="triplet i draws its pictures, crops and split from (seed, i)")
    p.add_argument("--val-fraction", type=float, default=0.05, help="share of the triplets in the validation split")
    p.add_argument("--min-edge-corr", type=float, default=0.3,
                   help="drop targets whose edge correlation with the content is lower")
    p.add_argument("--content-crop", type=_fraction_range, default=(0.45, 1.0), metavar="LO,HI",
                   help="content crop side as a fraction of the shorter side")
    p.add_argument("--style-crop", type=_fraction_range, default=(0.35, 1.0), metavar="LO,HI",
                   help="style crop side as a fraction of the shorter side")
    p.add_argument("--photo-styles", type=float, default=0.0, metavar="SHARE",
                   help="share of the triplets whose style is another content photograph instead of a style picture")
    p.add_argument("--rank", type=int, default=int(os.environ.get("RANK", os.environ.get("JOB_COMPLETION_INDEX", 0))),
                   help="this worker's rank (env RANK or JOB_COMPLETION_INDEX)")
    p.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", 1)),
                   help="number of workers (env WORLD_SIZE)")
    p.add_argument("--threads", type=int, default=1, help="onnxruntime threads")
    p.add_argument("--merge", action="store_true", help="only write the manifest from the logs so far")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    cfg = TeachConfig(**{f.name: getattr(a, f.name) for f in fields(TeachConfig)})
    return cfg, a


def main(argv: list[str] | None = None) -> int:
    try:
        cfg, a = parse_args(argv)
        manifest = merge(cfg) if a.merge else run(cfg, progress=not a.no_progress)
    except (FileNotFoundError, ValueError, RuntimeError, OSError) as e:
        print(f"teach: {e}", file=sys.stderr)
        return 2
    if manifest is None:
        print(f"[teach] rank {cfg.rank} of {cfg.world_size} done; the manifest is written when every rank is")
    else:
        n = sum(1 for _ in open(manifest, encoding="utf-8"))
        print(f"[teach] {n} triplets in {manifest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
