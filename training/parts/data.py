"""Triplet datasets for training: manifests (map-style) and webdataset shards (iterable), one item format:
`{"content", "style", "target": (3, S, S) float32 in [-1, 1], "id", "index", "skipped": list[str]}`.

Images are centre-cropped to S x S; `AugmentConfig` adds the SFT augmentations, drawn from (seed, epoch, index).
An unusable image is skipped with a warning and named in the item's `skipped` list.
"""
from __future__ import annotations

import glob
import json
import math
import random
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
import webdataset as wds
from PIL import Image
from torch.utils.data import Dataset, IterableDataset
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from stylevar.loaders.manifest import read_manifest
from stylevar.processing.images import ImageError, fit_square, load_image, pil_to_tensor

ROLES = ("content", "style", "target")


@dataclass(frozen=True)
class AugmentConfig:
    """The SFT augmentations; `AugmentConfig(enabled=False)` or `augment=None` gives plain crops."""

    enabled: bool = True
    content_max_degrees: float = 10.0  # rotation angle uniform in [-d, d]
    content_brightness: float = 0.2  # brightness factor uniform in [1 - b, 1 + b]
    rotate_target: bool = True  # rotate the target with its content
    style_crop_scale: tuple[float, float] = (0.3, 1.0)  # area fraction of the random resized crop
    style_crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)  # aspect ratio range (log-uniform)
    geometry: bool = True  # the rotation, the brightness jitter and the style crops; False: plain centre crops
    palette_permute: bool = False  # one random RGB channel order for the style and the target together

    def __post_init__(self) -> None:
        if not 0 <= self.content_max_degrees < 45:
            raise ValueError(f"content_max_degrees must be in [0, 45), not {self.content_max_degrees}")
        if not 0 <= self.content_brightness < 1:
            raise ValueError(f"content_brightness must be in [0, 1), not {self.content_brightness}")
        lo, hi = self.style_crop_scale
        if not 0 < lo <= hi <= 1:
            raise ValueError(f"style_crop_scale must satisfy 0 < lo <= hi <= 1, not {self.style_crop_scale}")
        rlo, rhi = self.style_crop_ratio
        if not 0 < rlo <= rhi:
            raise ValueError(f"style_crop_ratio must satisfy 0 < lo <= hi, not {self.style_crop_ratio}")


def item_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """A private generator for one item of one epoch."""
    state = np.random.SeedSequence([seed, epoch, index]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def _uniform(g: torch.Generator, lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(torch.rand((), generator=g))


def random_resized_box(w: int, h: int, cfg: AugmentConfig, g: torch.Generator) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of a random crop with area fraction and aspect in the config's ranges."""
    area = w * h
    log_lo, log_hi = math.log(cfg.style_crop_ratio[0]), math.log(cfg.style_crop_ratio[1])
    for _ in range(10):
        target_area = area * _uniform(g, *cfg.style_crop_scale)
        ratio = math.exp(_uniform(g, log_lo, log_hi))
        cw, ch = round(math.sqrt(target_area * ratio)), round(math.sqrt(target_area / ratio))
        if 0 < cw <= w and 0 < ch <= h:
            left = int(torch.randint(0, w - cw + 1, (), generator=g))
            top = int(torch.randint(0, h - ch + 1, (), generator=g))
            return left, top, left + cw, top + ch
    side = min(w, h)  # fallback: the centre square
    left, top = (w - side) // 2, (h - side) // 2
    return left, top, left + side, top + side


@dataclass(frozen=True)
class TripletTransform:
    """PIL triplet -> item tensors in [-1, 1]; augmentation drawn from (seed, epoch, index)."""

    image_size: int
    augment: AugmentConfig | None = None
    seed: int = 0

    def __call__(self, images: dict[str, Image.Image], index: int, epoch: int) -> dict[str, torch.Tensor]:
        aug = self.augment if self.augment is not None and self.augment.enabled else None
        if aug is None:
            return self._plain(images)
        g = item_generator(self.seed, epoch, index)
        out = self._geometry(images, aug, g) if aug.geometry else self._plain(images)
        if aug.palette_permute:
            order = torch.randperm(3, generator=g)
            for role in ("style", "target"):
                if role in out:
                    out[role] = out[role][order]
        return out

    def _plain(self, images: dict[str, Image.Image]) -> dict[str, torch.Tensor]:
        return {r: to_unit(fit_square(img, self.image_size, "crop")[0]) for r, img in images.items()}

    def _geometry(self, images: dict[str, Image.Image], aug: AugmentConfig, g: torch.Generator
                  ) -> dict[str, torch.Tensor]:
        s = self.image_size
        angle = _uniform(g, -aug.content_max_degrees, aug.content_max_degrees)
        brightness = _uniform(g, 1 - aug.content_brightness, 1 + aug.content_brightness)
        box = random_resized_box(*images["style"].size, aug, g)
        zoom = abs(math.cos(math.radians(angle))) + abs(math.sin(math.radians(angle)))

        def rotate(x_3SS: torch.Tensor) -> torch.Tensor:
            return TF.affine(x_3SS, angle=angle, translate=[0, 0], scale=zoom, shear=[0.0, 0.0],
                             interpolation=InterpolationMode.BILINEAR)

        out = {}
        content = rotate(pil_to_tensor(fit_square(images["content"], s, "crop")[0]))
        out["content"] = TF.adjust_brightness(content, brightness).clamp_(0, 1).mul_(2).sub_(1)
        style = images["style"].resize((s, s), Image.BICUBIC, box=box)
        out["style"] = pil_to_tensor(style).mul_(2).sub_(1)
        if "target" in images:
            target = pil_to_tensor(fit_square(images["target"], s, "crop")[0])
            out["target"] = (rotate(target) if aug.rotate_target else target).clamp_(0, 1).mul_(2).sub_(1)
        return out


def to_unit(img: Image.Image) -> torch.Tensor:
    """A PIL image as a (3, H, W) tensor in [-1, 1]."""
    return pil_to_tensor(img).mul_(2).sub_(1)


def try_load(path: str) -> Image.Image | str:
    """The image at ``path``, or the reason it cannot be used (for the skip report)."""
    try:
        return load_image(path)
    except FileNotFoundError:
        return "file not found"
    except (ImageError, OSError) as e:
        return f"{getattr(e, 'code', type(e).__name__)}: {e}"


def warn_skip(path: str, reason: str) -> None:
    warnings.warn(f"skipping unusable training image {path}: {reason}", RuntimeWarning, stacklevel=3)


@dataclass(frozen=True)
class _Entry:
    paths: dict[str, str]  # role -> absolute path
    id: str


class TripletDataset(Dataset):
    """Map-style triplets from one or more manifests (use with DistributedSampler for exact resume)."""

    def __init__(self, manifests: str | Path | Sequence[str | Path], split: str | None = "train", image_size: int = 256,
                 augment: AugmentConfig | None = None, seed: int = 0, max_skips: int = 100) -> None:
        paths = [manifests] if isinstance(manifests, (str, Path)) else list(manifests)
        if not paths:
            raise ValueError("no manifest given")
        for p in paths:  # all of them before reading any
            if not Path(p).is_file():
                raise FileNotFoundError(f"manifest not found: {p}")
        self.manifests = [str(Path(p).resolve()) for p in paths]
        self.split = split
        self.entries: list[_Entry] = []
        for p in paths:
            root = Path(p).resolve().parent
            for e in read_manifest(p):
                if split is None or e.split == split:
                    files = {r: str(root / getattr(e, r)) for r in ROLES if getattr(e, r) is not None}
                    self.entries.append(_Entry(files, e.id))
        if not self.entries:
            raise ValueError(f"no {split!r} entries in {', '.join(map(str, paths))}")
        self.transform = TripletTransform(image_size, augment, seed)
        self.max_skips = max_skips
        self.epoch = 0
        self.skipped: dict[str, str] = {}  # path -> reason, files found bad in this process

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.entries)

    def _load(self, entry: _Entry) -> dict[str, Image.Image] | tuple[str, str]:
        images = {}
        for role, path in entry.paths.items():
            if path in self.skipped:
                return path, self.skipped[path]
            loaded = try_load(path)
            if isinstance(loaded, str):
                return path, loaded
            images[role] = loaded
        return images

    def __getitem__(self, index: int) -> dict:
        n = len(self.entries)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for {n} items")
        index %= n
        passed: list[str] = []
        for step in range(min(self.max_skips, n)):
            entry = self.entries[(index + step) % n]
            loaded = self._load(entry)
            if isinstance(loaded, tuple):
                path, reason = loaded
                if path not in self.skipped:
                    self.skipped[path] = reason
                    warn_skip(path, reason)
                passed.append(path)
                continue
            item: dict = self.transform(loaded, index, self.epoch)
            item.update(id=entry.id, index=index, skipped=passed)
            return item
        raise RuntimeError(f"{len(passed)} consecutive entries from index {index} have unusable images "
                           f"(first: {passed[0]}: {self.skipped.get(passed[0])}); check the data")


class ShardTripletDataset(IterableDataset):
    """Iterable triplets from `data_tools.shards` shards, split over ranks and workers, shuffled by (seed, epoch);
    resume is per epoch (`set_epoch`): `TripletDataset` resumes exactly."""

    def __init__(self, urls: Sequence[str | Path], split: str | None = "train", image_size: int = 256,
                 augment: AugmentConfig | None = None, seed: int = 0, shuffle: bool = False,
                 shuffle_buffer: int = 1000) -> None:
        self.urls = [str(Path(u).resolve()) for u in urls]  # workers may start in another folder
        if not self.urls:
            raise ValueError("no shards given")
        for u in self.urls:
            if not Path(u).is_file():
                raise FileNotFoundError(f"shard not found: {u}")
        self.split = split
        self.transform = TripletTransform(image_size, augment, seed)
        self.seed, self.shuffle, self.shuffle_buffer = seed, shuffle, shuffle_buffer
        self.epoch = 0
        self.skipped: dict[str, str] = {}  # "<shard>:<member>" -> reason
        self.num_samples = _count_from_summary(self.urls, split)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict]:
        urls = list(self.urls)
        stages: list = []
        if self.shuffle:
            rng = random.Random(f"{self.seed}-{self.epoch}")
            rng.shuffle(urls)
            stages.append(wds.shuffle(self.shuffle_buffer, rng=rng))
        pipeline = wds.DataPipeline(
            wds.SimpleShardList(urls), wds.split_by_node, wds.split_by_worker, wds.tarfile_to_samples(), *stages
        )
        for sample in pipeline:
            item = self._decode(sample)
            if item is not None:
                yield item

    def _decode(self, sample: dict) -> dict | None:
        where = f"{sample.get('__url__', '?')}:{sample.get('__key__', '?')}"
        try:
            meta = json.loads(sample["json"])
        except (KeyError, ValueError) as e:
            return self._skip(where, f"no readable json metadata ({e})")
        if self.split is not None and meta.get("split") != self.split:
            return None
        images = {}
        for role in ROLES:
            found = [k for k in sample if k.split(".")[0] == role]
            if not found:
                if role == "target":
                    continue
                return self._skip(where, f"no {role} image in the sample")
            try:
                images[role] = load_image(bytes(sample[found[0]]))
            except ImageError as e:
                return self._skip(f"{where}.{found[0]}", f"{e.code}: {e}")
        item = self.transform(images, int(meta["index"]), self.epoch)
        item.update(id=str(meta.get("id")), index=int(meta["index"]), skipped=[])
        return item

    def _skip(self, where: str, reason: str) -> None:
        if where not in self.skipped:
            self.skipped[where] = reason
            warn_skip(where, reason)
        return None


def _count_from_summary(urls: list[str], split: str | None) -> int | None:
    """Samples in `urls` per the `shards.json` next to them, when every shard is listed there."""
    total = 0
    for folder in {str(Path(u).parent) for u in urls}:
        summary_path = Path(folder) / "shards.json"
        if not summary_path.is_file():
            return None
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        names = {Path(u).name for u in urls if str(Path(u).parent) == folder}
        for name, info in summary.get("splits", {}).items():
            if split is not None and name != split:
                continue
            listed = set(info.get("shards", []))
            if listed and listed <= names:
                total += int(info.get("count", 0))
            elif listed & names:
                return None  # only some of a split's shards: the count is unknown
    return total


def _resolve(path: str, split: str | None) -> tuple[str, list[str]]:
    """('manifest' | 'shards', files) for one argument of open_triplets."""
    p = Path(path)
    if p.is_file():
        if p.suffix == ".tar":
            return "shards", [str(p)]
        return "manifest", [str(p)]
    if p.is_dir():
        prefix = f"{split}-" if split is not None else ""
        shards = sorted(str(x) for x in p.glob(f"{prefix}*.tar"))
        if shards:
            return "shards", shards
        if (p / "manifest.jsonl").is_file():
            return "manifest", [str(p / "manifest.jsonl")]
        raise FileNotFoundError(f"{p} holds neither manifest.jsonl nor {prefix}*.tar shards")
    if any(ch in path for ch in "*?[{"):
        files = sorted({f for u in wds.shardlists.expand_urls(path) for f in glob.glob(u)})
        if not files:
            raise FileNotFoundError(f"no files match {path}")
        return ("shards" if all(f.endswith(".tar") for f in files) else "manifest"), files
    raise FileNotFoundError(f"manifest or shards not found: {path}")


def open_triplets(paths: Sequence[str | Path] | str | Path, split: str | None = "train", image_size: int = 256,
                  augment: AugmentConfig | None = None, *, seed: int = 0,
                  shuffle: bool = False) -> TripletDataset | ShardTripletDataset:
    """One dataset from manifests (map-style) or from shards (iterable); mixing the two is an error."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if not paths:
        raise ValueError("no dataset paths given")
    kinds: set[str] = set()
    files: list[str] = []
    for path in paths:
        kind, found = _resolve(str(path), split)
        kinds.add(kind)
        files.extend(found)
    if len(kinds) > 1:
        raise ValueError("give either manifests or shards, not both: " + ", ".join(map(str, paths)))
    if kinds == {"manifest"}:
        return TripletDataset(files, split, image_size, augment, seed)
    return ShardTripletDataset(files, split, image_size, augment, seed, shuffle=shuffle)


def collate_triplets(batch: list[dict | None]) -> dict:
    """Stack items into (B, 3, S, S) tensors; drops None items and concatenates `skipped` lists."""
    items = [b for b in batch if b is not None]
    if not items:
        raise ValueError("a batch with no valid items")
    out: dict = {
        "content": torch.stack([b["content"] for b in items]),
        "style": torch.stack([b["style"] for b in items]),
        "id": [b["id"] for b in items],
        "index": torch.tensor([b["index"] for b in items]),
        "skipped": [p for b in items for p in b.get("skipped", [])],
    }
    with_target = sum("target" in b for b in items)
    if with_target == len(items):
        out["target"] = torch.stack([b["target"] for b in items])
    elif with_target:
        raise ValueError("a batch mixes paired items (with target) and unpaired items")
    return out


def dataset_size(ds: Dataset | None) -> str:
    """How many items, for log lines: shard datasets know it from shards.json or not at all ("?")."""
    if ds is None:
        return "0"
    n = len(ds) if not isinstance(ds, IterableDataset) else getattr(ds, "num_samples", None)
    return str(n) if n is not None else "?"


DATA_HINT = ("--data takes triplets: a manifest (JSON lines), a folder holding one or shards; python -m data_tools.synth "
             "makes a set, python -m data_tools.teach one from your own photos and paintings")


def check_data_args(data: Sequence[str]) -> None:
    """Fail fast (SystemExit, one line) on a --data value that is not triplets (a manifest is read whole here)."""
    for d in data:
        try:
            kind, files = _resolve(d, "train")
            for manifest in files if kind == "manifest" else ():
                read_manifest(manifest)
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(f"error: --data {d}: {e} ({DATA_HINT})") from None
