"""Triplet manifests: JSON lines `{"content", "style", "target"?, "split", "id"}`, paths relative to the
manifest's folder; shared by the data tools, the training datasets and `stylevar evaluate`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable

from stylevar.utils.atomic import atomic_write

SPLITS = ("train", "val")


@dataclass(frozen=True)
class ManifestEntry:
    content: str
    style: str
    target: str | None
    split: str
    id: str

    def to_json(self) -> dict:
        d = {"content": self.content, "style": self.style}
        if self.target is not None:
            d["target"] = self.target
        d.update(split=self.split, id=self.id)
        return d


def write_manifest(entries: Iterable[ManifestEntry], path: str | os.PathLike) -> Path:
    """Write JSON lines (UTF-8) atomically: a temporary file renamed into place (stylevar.utils.atomic)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(f: BinaryIO) -> None:
        for e in entries:
            f.write((json.dumps(e.to_json(), ensure_ascii=False) + "\n").encode("utf-8"))

    return atomic_write(path, write, what="manifest")


def read_manifest(path: str | os.PathLike) -> list[ManifestEntry]:
    """Parse a manifest; a missing file raises FileNotFoundError, a malformed line ValueError."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"manifest not found: {path}")
    entries = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON: {e}") from e
            if not isinstance(d, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object")
            missing = [k for k in ("content", "style") if not isinstance(d.get(k), str)]
            if missing:
                raise ValueError(f"{path}:{lineno}: missing or non-string field(s) {missing}")
            split = d.get("split", "train")
            if split not in SPLITS:
                raise ValueError(f"{path}:{lineno}: split must be one of {SPLITS}, not {split!r}")
            target = d.get("target")
            if target is not None and not isinstance(target, str):
                raise ValueError(f"{path}:{lineno}: target must be a string")
            entries.append(ManifestEntry(d["content"], d["style"], target, split, str(d.get("id", lineno - 1))))
    return entries


def manifest_path(source: str | os.PathLike) -> Path:
    """A manifest file, or the `manifest.jsonl` of a folder; FileNotFoundError names what is missing."""
    p = Path(source)
    if p.is_dir():
        m = p / "manifest.jsonl"
        if not m.is_file():
            found = sorted(x.name for x in p.glob("*.jsonl"))
            raise FileNotFoundError(f"{p} has no manifest.jsonl" + (f" (found: {', '.join(found)})" if found else ""))
        return m
    if not p.is_file():
        raise FileNotFoundError(f"manifest not found: {p}")
    return p
