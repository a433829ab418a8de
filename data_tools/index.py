"""Triplet manifests: the JSON-lines format, seeded splits, and indexers for dataset layouts.

`omnistyle`: `root/{content,style}/*` and `root/target/<content>&&<style>.<ext>`; `imagepulse`: one folder per
triplet; `pairs`: unpaired evaluation pairs (no target). What does not decode is left out and listed in
`<out>.report.json`; the split is seeded (`--val-fraction`).
"""
from __future__ import annotations

import json
import math
import os
import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path

from stylevar.cli.command import Parser
from stylevar.processing.images import ImageError, load_image
from stylevar.loaders.manifest import SPLITS, ManifestEntry, read_manifest, write_manifest  # noqa: F401 (re-exported)

LAYOUTS = ("omnistyle", "imagepulse", "pairs")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff", ".gif")
PAIR_SEPARATOR = "&&"


def assign_splits(n: int, val_fraction: float, seed: int) -> list[str]:
    """Seeded split labels for items 0..n-1 (in a fixed order): round(n * fraction) are `val`."""
    if not 0.0 <= val_fraction <= 1.0:
        raise ValueError(f"val_fraction must be in [0, 1], not {val_fraction}")
    n_val = int(round(n * val_fraction))
    if val_fraction > 0 and n_val == 0 and n >= 2:
        n_val = 1
    val = set(random.Random(seed).sample(range(n), n_val))
    return ["val" if i in val else "train" for i in range(n)]


@dataclass(frozen=True)
class BadFile:
    path: str
    code: str
    reason: str


def check_image(path: Path) -> BadFile | None:
    """Decode one file fully; None when it is a usable image, else why not. Never raises."""
    try:
        load_image(path)
    except ImageError as e:
        return BadFile(str(path), e.code, str(e))
    except OSError as e:
        return BadFile(str(path), "unreadable", f"{type(e).__name__}: {e}")
    except Exception as e:  # a decoder bug on a hostile file must not stop a 150K-file index
        return BadFile(str(path), "decode_error", f"{type(e).__name__}: {e}")
    return None


def check_images(paths: list[Path], workers: int) -> dict[Path, BadFile]:
    """Decode every file in a thread pool (Pillow releases the GIL while decoding)."""
    if workers <= 1 or len(paths) <= 1:
        results = [check_image(p) for p in paths]
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(check_image, paths))
    return {p: r for p, r in zip(paths, results) if r is not None}


def _list_files(folder: Path, recursive: bool = False) -> list[Path]:
    if not folder.is_dir():
        raise FileNotFoundError(f"folder not found: {folder}")
    it = folder.rglob("*") if recursive else folder.iterdir()

    def hidden(p: Path) -> bool:
        return any(part.startswith(".") for part in p.relative_to(folder).parts)

    return sorted(p for p in it if p.is_file() and not hidden(p))


@dataclass(frozen=True)
class Candidate:
    """A triplet (or pair) found in a layout, before the split; paths absolute."""

    id: str
    content: Path
    style: Path
    target: Path | None


@dataclass
class IndexResult:
    candidates: list[Candidate]
    bad_files: list[BadFile]
    skipped: list[dict]
    files_checked: int


def _stem_map(files: list[Path], bad: dict[Path, BadFile], skipped: list[dict], role: str) -> dict[str, Path]:
    by_stem: dict[str, list[Path]] = {}
    for p in files:
        if p not in bad:
            by_stem.setdefault(p.stem, []).append(p)
    out = {}
    for stem, ps in by_stem.items():
        if len(ps) > 1:
            skipped.append({"item": f"{role}/{stem}", "reason": f"ambiguous: {len(ps)} {role} files share the stem"})
        else:
            out[stem] = ps[0]
    return out


def index_omnistyle(root: Path, workers: int) -> IndexResult:
    contents, styles, targets = (_list_files(root / sub) for sub in ("content", "style", "target"))
    bad = check_images(contents + styles + targets, workers)
    skipped: list[dict] = []
    content_of = _stem_map(contents, bad, skipped, "content")
    style_of = _stem_map(styles, bad, skipped, "style")
    candidates = []
    target_stems = Counter(t.stem for t in targets if t not in bad)
    for t in targets:
        if t in bad:
            skipped.append({"item": t.name, "reason": f"target is a bad file ({bad[t].code})"})
            continue
        stem = t.stem
        if target_stems[stem] > 1:
            skipped.append({"item": t.name, "reason": "ambiguous: several target files share the stem"})
            continue
        cuts = [i for i in range(len(stem)) if stem.startswith(PAIR_SEPARATOR, i)]
        if not cuts:
            skipped.append({"item": t.name, "reason": f"target name has no '{PAIR_SEPARATOR}'"})
            continue
        match = None
        for i in cuts:
            c, s = stem[:i], stem[i + len(PAIR_SEPARATOR):]
            if c in content_of and s in style_of:
                match = (content_of[c], style_of[s])
                break
        if match is None:
            c, s = stem[: cuts[0]], stem[cuts[0] + len(PAIR_SEPARATOR):]
            skipped.append({"item": t.name, "reason": f"no usable content {c!r} and style {s!r} for this target"})
            continue
        candidates.append(Candidate(stem, match[0], match[1], t))
    return IndexResult(candidates, list(bad.values()), skipped, len(contents) + len(styles) + len(targets))


def index_imagepulse(root: Path, workers: int) -> IndexResult:
    if not root.is_dir():
        raise FileNotFoundError(f"folder not found: {root}")
    roles = ("content", "style", "target")
    skipped: list[dict] = []
    found: list[tuple[str, dict[str, Path]]] = []
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        files: dict[str, list[Path]] = {r: [] for r in roles}
        for f in d.iterdir():
            if f.is_file() and f.stem in files:
                files[f.stem].append(f)
        missing = [r for r in roles if not files[r]]
        several = [r for r in roles if len(files[r]) > 1]
        if missing or several:
            why = f"missing {missing}" if missing else f"several files for {several}"
            skipped.append({"item": d.name, "reason": f"incomplete triplet folder: {why}"})
            continue
        found.append((d.name, {r: files[r][0] for r in roles}))
    paths = [p for _, f in found for p in f.values()]
    bad = check_images(paths, workers)
    candidates = []
    for name, f in found:
        bad_roles = [r for r in roles if f[r] in bad]
        if bad_roles:
            why = ", ".join(f"{r} ({bad[f[r]].code})" for r in bad_roles)
            skipped.append({"item": name, "reason": f"bad file(s): {why}"})
            continue
        candidates.append(Candidate(name, f["content"], f["style"], f["target"]))
    return IndexResult(candidates, list(bad.values()), skipped, len(paths))


def _first_valid(paths: list[Path], need: int, workers: int, bad: dict[Path, BadFile]) -> tuple[list[Path], int]:
    """The first `need` decodable files of `paths` (in order), checking in parallel batches."""
    valid: list[Path] = []
    pos = 0
    while len(valid) < need and pos < len(paths):
        batch = paths[pos : pos + max(2 * workers, math.ceil((need - len(valid)) * 1.1) + 4)]
        pos += len(batch)
        found = check_images(batch, workers)
        bad.update(found)
        valid.extend(p for p in batch if p not in found)
    return valid[:need], pos


def index_pairs(root: Path, styles_root: Path, count: int | None, seed: int, workers: int) -> IndexResult:
    contents = [p for p in _list_files(root, recursive=True) if p.suffix.lower() in IMAGE_SUFFIXES]
    styles = [p for p in _list_files(styles_root, recursive=True) if p.suffix.lower() in IMAGE_SUFFIXES]
    if not contents or not styles:
        raise ValueError(f"no images found in {root if not contents else styles_root}")
    count = len(contents) if count is None else count
    if count < 1:
        raise ValueError(f"count must be >= 1, not {count}")
    rng = random.Random(seed)
    rng.shuffle(contents)
    rng.shuffle(styles)
    bad: dict[Path, BadFile] = {}
    good_c, checked_c = _first_valid(contents, min(count, len(contents)), workers, bad)
    good_s, checked_s = _first_valid(styles, min(count, len(styles)), workers, bad)
    if not good_c or not good_s:
        raise ValueError("no decodable " + ("content" if not good_c else "style") + " images")
    style_order: list[int] = []
    while len(style_order) < count:  # every pass over the styles in a fresh order
        perm = list(range(len(good_s)))
        rng.shuffle(perm)
        style_order.extend(perm)
    candidates = [
        Candidate(f"pair-{i:06d}", good_c[i % len(good_c)], good_s[style_order[i]], None) for i in range(count)
    ]
    return IndexResult(candidates, list(bad.values()), [], checked_c + checked_s)


@dataclass(frozen=True)
class IndexConfig:
    layout: str
    root: str
    out: str
    styles: str | None = None
    seed: int = 42
    val_fraction: float | None = None  # None: 0.05, or 1.0 for pairs
    workers: int = 0  # 0: os.cpu_count()
    count: int | None = None  # pairs only

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, not {self.layout!r}")
        if self.layout == "pairs" and not self.styles:
            raise ValueError("the pairs layout needs --styles (the style image folder)")


def build_index(cfg: IndexConfig) -> dict:
    """Index, write the manifest and `<out>.report.json`; returns the report."""
    start = time.perf_counter()
    root = Path(cfg.root)
    workers = cfg.workers or os.cpu_count() or 1
    if cfg.layout == "omnistyle":
        res = index_omnistyle(root, workers)
    elif cfg.layout == "imagepulse":
        res = index_imagepulse(root, workers)
    else:
        res = index_pairs(root, Path(cfg.styles or ""), cfg.count, cfg.seed, workers)
    val_fraction = cfg.val_fraction if cfg.val_fraction is not None else (1.0 if cfg.layout == "pairs" else 0.05)
    cands = res.candidates if cfg.layout == "pairs" else sorted(res.candidates, key=lambda c: c.id)
    splits = assign_splits(len(cands), val_fraction, cfg.seed)
    out = Path(cfg.out)
    base = out.parent.resolve()

    def rel(p: Path) -> str:
        return Path(os.path.relpath(p.resolve(), base)).as_posix()

    entries = [
        ManifestEntry(rel(c.content), rel(c.style), rel(c.target) if c.target is not None else None, s, c.id)
        for c, s in zip(cands, splits)
    ]
    write_manifest(entries, out)
    report = {
        "layout": cfg.layout,
        "root": str(root),
        "styles": cfg.styles,
        "manifest": str(out),
        "seed": cfg.seed,
        "val_fraction": val_fraction,
        "counts": {
            "files_checked": res.files_checked,
            "bad_files": len(res.bad_files),
            "skipped": len(res.skipped),
            "entries": len(entries),
            "train": splits.count("train"),
            "val": splits.count("val"),
        },
        "bad_files": [
            {"path": b.path, "code": b.code, "reason": b.reason} for b in sorted(res.bad_files, key=lambda b: b.path)
        ],
        "skipped": res.skipped,
        "seconds": round(time.perf_counter() - start, 3),
    }
    report_path = out.with_name(out.name + ".report.json")
    report_path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return report


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m data_tools.index", description=__doc__.split("\n")[0])
    p.add_argument("--layout", required=True, choices=LAYOUTS, help="how the dataset is laid out on disk (module doc)")
    p.add_argument("--root", required=True, help="dataset root (pairs: the content image folder)")
    p.add_argument("--styles", help="pairs only: the style image folder")
    p.add_argument("--out", required=True, help="manifest path (JSON lines)")
    p.add_argument("--seed", type=int, default=42, help="seed of the train/validation split")
    p.add_argument("--val-fraction", type=float, default=None, help="share of the entries in the validation split (default: 0.05; 1.0 for pairs)")
    p.add_argument("--workers", type=int, default=0, help="decoding threads (default: CPU count)")
    p.add_argument("--count", type=int, default=None, help="pairs only: number of pairs (default: one per content)")
    args = p.parse_args(argv)
    try:
        report = build_index(IndexConfig(**{f.name: getattr(args, f.name) for f in fields(IndexConfig)}))
    except (FileNotFoundError, ValueError) as e:
        p.error(str(e))
    print(json.dumps({"manifest": report["manifest"], **report["counts"], "seconds": report["seconds"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
