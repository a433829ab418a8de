"""A triplet manifest packed small enough to travel: every image re-encoded as a JPEG, in one self-contained folder.

    python -m data_tools.pack --manifest M --out DIR [--roles style,target] [--quality 85] [--max-mib 32]

A lent GPU machine reaches no network and takes at most 64 MiB of files with it (docs/training.md, "Training the
tokenizer on a lent GPU"), so the teacher triplets that train the 128 px tokenizer travel packed: each distinct image
of the manifest's ``--roles`` (default all three) is decoded and written once as `DIR/images/<n>.jpg` at quality
``--quality`` (4:4:4, no chroma subsampling: the strokes' colours are what the tokenizer must keep), and
`DIR/manifest.jsonl` lists the same entries, ids and splits with their new paths (the recipes' format; the per-entry
`sources` are left out of it). A role left out names the file `not-packed/<role>`, which does not exist: a tokenizer
run given the same ``--roles`` never reads it, and any other reader skips each entry with a line naming it, then
stops. `DIR/sources.json` is the source manifest's folder's copy (every picture's source and licence) and
`DIR/pack.json` says what was packed: counts, bytes, seconds, the entries left out (a missing or undecodable image,
one line each) and the quality. The pack is refused, before anything is written, when `DIR` holds files already,
and it fails with the byte count when it grows past ``--max-mib``, leaving nothing behind (it is built in a folder
beside `DIR`, renamed into place when whole).
"""
from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from data_tools.index import ManifestEntry, read_manifest, write_manifest
from stylevar.processing.images import ImageError, load_image
from stylevar.utils.atomic import atomic_folder
from stylevar.utils.helptext import HelpFormatter

ROLES = ("content", "style", "target")
MIB = 1 << 20
DEFAULT_QUALITY = 85  # the 2,319 teacher triplets' styles and targets: 25.9 MiB at 85, 32.8 at 90
DEFAULT_MAX_MIB = 32.0  # a lent GPU takes 64 MiB in all: the repository's tracked files are 27 MiB, the wheels 3


@dataclass(frozen=True)
class PackConfig:
    manifest: Path
    out: Path
    roles: tuple[str, ...] = ROLES
    quality: int = DEFAULT_QUALITY
    max_mib: float = DEFAULT_MAX_MIB

    def __post_init__(self) -> None:
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be in 1..100, not {self.quality}")
        if not self.roles or set(self.roles) - set(ROLES):
            raise ValueError(f"roles must be among {', '.join(ROLES)}, not {', '.join(self.roles) or 'none'}")


class PackTooLarge(ValueError):
    """The packed images outgrew ``--max-mib``."""


def jpeg_bytes(path: Path, quality: int) -> bytes:
    """One image decoded (bounded, as every upload is) and re-encoded as an RGB JPEG; ImageError/OSError if unusable."""
    img = load_image(path)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality, subsampling=0, optimize=True)
    return buf.getvalue()


class Packer:
    """Writes each distinct source image once into ``folder`` and remembers its packed name."""

    def __init__(self, cfg: PackConfig, folder: Path):
        self.cfg, self.folder = cfg, folder
        self.names: dict[Path, str] = {}
        self.bytes = 0

    def add(self, path: Path) -> str:
        if path not in self.names:
            data = jpeg_bytes(path, self.cfg.quality)
            self.bytes += len(data)
            if self.bytes > self.cfg.max_mib * MIB:
                raise PackTooLarge(f"the pack grew past --max-mib {self.cfg.max_mib:g} ({self.bytes / MIB:.1f} MiB "
                                   f"after {len(self.names) + 1} images): lower --quality or pack fewer triplets")
            name = f"images/{len(self.names):06d}.jpg"
            (self.folder / name).write_bytes(data)
            self.names[path] = name
        return self.names[path]

    def entry(self, e: ManifestEntry, root: Path) -> ManifestEntry:
        paths = {role: self.add(root / getattr(e, role)) if role in self.cfg.roles else f"not-packed/{role}"
                 for role in ROLES if getattr(e, role) is not None}
        return ManifestEntry(paths["content"], paths["style"], paths.get("target"), e.split, e.id)


def pack(cfg: PackConfig) -> dict:
    """Pack ``cfg.manifest`` into ``cfg.out`` (whole or not at all: built beside it, then renamed); returns the
    summary written to `pack.json`."""
    start = time.perf_counter()
    entries = read_manifest(cfg.manifest)
    root = cfg.manifest.parent
    if cfg.out.exists() and any(cfg.out.iterdir()):
        raise FileExistsError(f"{cfg.out} holds files already: remove it or choose another --out")
    with atomic_folder(cfg.out, what="pack") as folder:
        (folder / "images").mkdir()
        packer, packed, left_out = Packer(cfg, folder), [], []
        for e in entries:
            try:
                packed.append(packer.entry(e, root))
            except (ImageError, OSError) as err:
                left_out.append({"id": e.id, "reason": f"{type(err).__name__}: {err}"})
                print(f"[pack] left out {e.id}: {err}", file=sys.stderr)
        write_manifest(packed, folder / "manifest.jsonl")
        if (root / "sources.json").is_file():
            shutil.copyfile(root / "sources.json", folder / "sources.json")
        summary = pack_summary(cfg, packer, packed, left_out, time.perf_counter() - start)
        (folder / "pack.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def pack_summary(cfg: PackConfig, packer: Packer, packed: list[ManifestEntry], left_out: list[dict],
                 seconds: float) -> dict:
    """What `pack.json` says of a pack."""
    return {"manifest": str(cfg.manifest), "roles": list(cfg.roles), "quality": cfg.quality, "entries": len(packed),
            "splits": {s: sum(e.split == s for e in packed) for s in sorted({e.split for e in packed})},
            "images": len(packer.names), "bytes": packer.bytes, "left_out": left_out, "seconds": round(seconds, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m data_tools.pack", description=__doc__.split("\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--manifest", required=True, type=Path, help="the triplet manifest (JSON lines) to pack")
    p.add_argument("--out", required=True, type=Path, help="the pack's folder (manifest.jsonl, images/, pack.json)")
    p.add_argument("--roles", default=",".join(ROLES),
                   help="the images packed, comma-separated (the tokenizer's: style,target)")
    p.add_argument("--quality", type=int, default=DEFAULT_QUALITY,
                   help="JPEG quality of every packed image (the 2,319 teacher triplets' styles and targets: 25.9 MiB "
                        "at 85, 32.8 at 90)")
    p.add_argument("--max-mib", type=float, default=DEFAULT_MAX_MIB,
                   help="fail when the images pass this size (a lent GPU takes 64 MiB in all: the repository's "
                        "tracked files are 27 MiB, the wheels 3)")
    args = p.parse_args(argv)
    try:
        summary = pack(PackConfig(args.manifest, args.out, tuple(args.roles.split(",")), args.quality, args.max_mib))
    except (OSError, ValueError) as e:  # a missing manifest, a pack there already, too large, a failed write
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"[pack] {summary['entries']} triplets, {summary['images']} images, {summary['bytes'] / MIB:.1f} MiB "
          f"in {summary['seconds']} s into {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
