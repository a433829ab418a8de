"""WebDataset tar shards from a triplet manifest.

Writes `DIR/{split}-000000.tar`, ...: per entry `<split>-<index:08d>.{content,style,target}.<ext>` (the source
bytes, or PNG) and `.json` (split, id, index, paths). Entries with an unusable image are left out and listed in
`DIR/shards.json`; the same manifest gives byte-identical shards.
"""
from __future__ import annotations

import io
import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from data_tools.index import SPLITS, ManifestEntry, read_manifest
from stylevar.cli.command import Parser
from stylevar.utils.extras import extra_error
from stylevar.processing.images import ImageError, load_image

KEEP_FORMATS = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp"}
SHARD_RE = re.compile(r"^(train|val)-\d{6}\.tar$")
ROLES = ("content", "style", "target")


@dataclass(frozen=True)
class ShardConfig:
    manifest: str
    out: str
    shard_size: int = 1000
    workers: int = 0  # 0: os.cpu_count()
    overwrite: bool = False

    def __post_init__(self) -> None:
        if self.shard_size < 1:
            raise ValueError(f"shard_size must be >= 1, not {self.shard_size}")


def encode_member(path: Path) -> tuple[str, bytes]:
    """(extension, bytes) to store for one image; raises ImageError / OSError when it cannot be used."""
    data = path.read_bytes()
    img = load_image(data)  # full decode: the check
    with Image.open(io.BytesIO(data)) as probe:
        fmt = probe.format
    if fmt in KEEP_FORMATS:
        return KEEP_FORMATS[fmt], data
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=6)
    return "png", buf.getvalue()


def _build_sample(args: tuple[ManifestEntry, int, Path]) -> dict | str:
    """A webdataset sample dict, or a string naming why the entry is left out."""
    entry, index, root = args
    sample: dict = {"__key__": f"{entry.split}-{index:08d}"}
    for role in ROLES:
        rel = getattr(entry, role)
        if rel is None:
            continue
        path = root / rel
        try:
            ext, data = encode_member(path)
        except FileNotFoundError:
            return f"{role} missing: {path}"
        except (ImageError, OSError) as e:
            return f"{role} unusable ({getattr(e, 'code', type(e).__name__)}): {path}: {e}"
        sample[f"{role}.{ext}"] = data
    meta = {"split": entry.split, "id": entry.id, "index": index,
            "content": entry.content, "style": entry.style, "target": entry.target}
    sample["json"] = json.dumps(meta, ensure_ascii=False).encode("utf-8")
    return sample


def write_shards(cfg: ShardConfig) -> dict:
    """Write the shards and `DIR/shards.json`; returns that summary."""
    import webdataset as wds  # it imports torch: only here, so that --help stays fast
    start = time.perf_counter()
    manifest = Path(cfg.manifest)
    entries = read_manifest(manifest)
    root = manifest.parent
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    old = sorted(p for p in out.iterdir() if SHARD_RE.match(p.name))
    if old and not cfg.overwrite:
        raise FileExistsError(f"{out} already holds shards ({old[0].name}, ...); pass --overwrite to replace them")
    for p in old:
        p.unlink()
    workers = cfg.workers or os.cpu_count() or 1
    summary: dict = {"manifest": str(manifest), "shard_size": cfg.shard_size, "splits": {}, "skipped": []}
    for split in SPLITS:
        jobs = [(e, i, root) for i, e in enumerate(x for x in entries if x.split == split)]
        if not jobs:
            continue
        writer = None
        written = 0
        with ThreadPoolExecutor(max_workers=workers) as pool:
            # map keeps manifest order; chunks bound the memory held by finished-but-unwritten samples
            for lo in range(0, len(jobs), 256):
                for job, sample in zip(jobs[lo : lo + 256], pool.map(_build_sample, jobs[lo : lo + 256])):
                    if isinstance(sample, str):
                        summary["skipped"].append({"id": job[0].id, "split": split, "reason": sample})
                        continue
                    if writer is None:
                        writer = wds.ShardWriter(str(out / f"{split}-%06d.tar"), maxcount=cfg.shard_size,
                                                 verbose=0, mtime=0.0)
                    writer.write(sample)
                    written += 1
        if writer is not None:
            writer.close()
        shards = sorted(p.name for p in out.iterdir() if p.name.startswith(f"{split}-") and SHARD_RE.match(p.name))
        summary["splits"][split] = {"count": written, "shards": shards}
    summary["seconds"] = round(time.perf_counter() - start, 3)
    (out / "shards.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m data_tools.shards", description=__doc__.split("\n")[0])
    p.add_argument("--manifest", required=True, help="the manifest (JSON lines) whose samples go into the shards")
    p.add_argument("--out", required=True, help="output folder for {split}-NNNNNN.tar and shards.json")
    p.add_argument("--shard-size", type=int, default=1000, help="samples per shard")
    p.add_argument("--workers", type=int, default=0, help="decoding threads (default: CPU count)")
    p.add_argument("--overwrite", action="store_true", help="replace shards already in --out")
    args = p.parse_args(argv)
    if error := extra_error("train", "writing shards"):
        p.error(error)
    try:
        summary = write_shards(ShardConfig(args.manifest, args.out, args.shard_size, args.workers, args.overwrite))
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        p.error(str(e))
    print(json.dumps({k: v for k, v in summary.items() if k != "skipped"} | {"skipped": len(summary["skipped"])}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
