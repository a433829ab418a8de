"""Procedural (content, style, target) triplets with a known, deterministic target.

Content: a procedural scene (`data_tools.drawing`); style: a palette painted as a texture; target: the content's
equalised luminance read on the style's palette ramp, modulated by its texture (:func:`stylize`), so every
luminance edge of the content stays an edge of the target. The same seed gives byte-identical PNGs.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from data_tools.drawing import CONTENT_KINDS, STYLE_KINDS, Style, luma, make_content, make_style
from data_tools.index import ManifestEntry, assign_splits, write_manifest
from stylevar.cli.command import Parser

PNG_COMPRESS_LEVEL = 6
TEXTURE_STRENGTH = 0.15

Array = np.ndarray


@dataclass(frozen=True)
class SynthConfig:
    out: str
    count: int = 1000
    size: int = 128
    seed: int = 0
    val_fraction: float = 0.05

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"count must be >= 1, not {self.count}")
        if self.size < 8:
            raise ValueError(f"size must be >= 8 pixels, not {self.size}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, not {self.seed}")
        if not 0.0 <= self.val_fraction <= 1.0:
            raise ValueError(f"val_fraction must be in [0, 1], not {self.val_fraction}")


def equalised_tone(lum_HW: Array) -> Array:
    """The empirical CDF of `lum_HW` at each pixel, mid-rank for ties: (S, S) in (0, 1)."""
    values, inverse, counts = np.unique(lum_HW.ravel(), return_inverse=True, return_counts=True)
    mid_rank = (np.cumsum(counts) - counts / 2) / lum_HW.size
    return mid_rank[inverse].reshape(lum_HW.shape)


def palette_ramp(palette_n3: Array, q_HW: Array) -> Array:
    """The palette as a piecewise-linear ramp (colour i at i / (n - 1)) read at q: (S, S, 3)."""
    stops = np.linspace(0.0, 1.0, len(palette_n3))
    return np.stack([np.interp(q_HW, stops, palette_n3[:, c]) for c in range(3)], axis=-1).astype(np.float32)


def stylize(content_HW3: Array, style: Style) -> Array:
    """The target: the equalised tone of the content's luminance on the style's palette ramp, times 1 + 0.15 (T -
    mean T) with T the style's normalised luminance: (S, S, 3) float32 in [0, 255] (not yet rounded)."""
    lum = luma(np.asarray(content_HW3, dtype=np.float32)) / 255.0
    base = palette_ramp(style.palette, equalised_tone(lum))
    t = luma(style.image.astype(np.float32))
    t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    base = base * (1.0 + TEXTURE_STRENGTH * (t - t.mean()))[..., None]
    return np.clip(base, 0.0, 255.0)


def _to_pil(img_HW3: Array) -> Image.Image:
    return Image.fromarray(np.round(img_HW3).astype(np.uint8), "RGB")


def make_triplet_arrays(
    rng: np.random.Generator, size: int, content_kind: str | None = None, style_kind: str | None = None
) -> tuple[Array, Array, Array]:
    """(content, style, target), each (S, S, 3) uint8; the target is computed from the 8-bit inputs."""
    content = np.round(make_content(rng, size, content_kind)).astype(np.uint8)
    style = make_style(rng, size, style_kind)
    style = Style(style.palette, np.round(style.image).astype(np.uint8))
    target = np.round(stylize(content, style)).astype(np.uint8)
    return content, style.image, target


def make_triplet(rng: np.random.Generator, size: int) -> tuple[Image.Image, Image.Image, Image.Image]:
    """One random triplet as RGB PIL images (content, style, target)."""
    return tuple(Image.fromarray(a, "RGB") for a in make_triplet_arrays(rng, size))  # type: ignore[return-value]


def save_png(img: Image.Image, path: Path) -> None:
    """PNG with fixed settings and no metadata, so equal pixels give equal bytes."""
    img.save(path, format="PNG", compress_level=PNG_COMPRESS_LEVEL)


def generate(cfg: SynthConfig) -> Path:
    """Write `cfg.count` triplets and the manifest under `cfg.out`; returns the manifest path."""
    out = Path(cfg.out)
    for sub in ("content", "style", "target"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    splits = assign_splits(cfg.count, cfg.val_fraction, cfg.seed)
    entries = []
    for i in range(cfg.count):
        rng = np.random.default_rng([cfg.seed, i])
        arrays = make_triplet_arrays(rng, cfg.size)
        name = f"{i:06d}.png"
        for sub, arr in zip(("content", "style", "target"), arrays):
            save_png(Image.fromarray(arr, "RGB"), out / sub / name)
        entries.append(
            ManifestEntry(content=f"content/{name}", style=f"style/{name}", target=f"target/{name}",
                          split=splits[i], id=f"{i:06d}")
        )
    manifest = out / "manifest.jsonl"
    write_manifest(entries, manifest)
    return manifest


def write_examples(out: str | Path, size: int = 256, seed: int = 2024) -> list[Path]:
    """The gallery: content_<kind>.png for every scene kind and style_<kind>.png for every texture."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, kind in enumerate(CONTENT_KINDS):
        arr = make_content(np.random.default_rng([seed, 0, i]), size, kind)
        paths.append(out / f"content_{kind}.png")
        save_png(_to_pil(arr), paths[-1])
    for i, kind in enumerate(STYLE_KINDS):
        style = make_style(np.random.default_rng([seed, 1, i]), size, kind)
        paths.append(out / f"style_{kind}.png")
        save_png(_to_pil(style.image), paths[-1])
    return paths


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m data_tools.synth", description=__doc__.split("\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", help="output folder for triplets and manifest.jsonl")
    where.add_argument("--examples", metavar="DIR", help="write the example gallery (content_*, style_*) here")
    p.add_argument("--count", type=int, default=1000, help="triplets to write")
    p.add_argument("--size", type=int, default=None, help="side in pixels (default: 128; 256 for --examples)")
    p.add_argument("--seed", type=int, default=None, help="seed of the drawing (default: 0; 2024 for --examples)")
    p.add_argument("--val-fraction", type=float, default=0.05, help="share of triplets in the validation split")
    args = p.parse_args(argv)
    start = time.perf_counter()
    if args.examples:
        paths = write_examples(args.examples, args.size or 256, 2024 if args.seed is None else args.seed)
        print(json.dumps({"examples": [str(x) for x in paths], "seconds": round(time.perf_counter() - start, 2)}))
        return 0
    cfg = SynthConfig(out=args.out, count=args.count, size=args.size or 128,
                      seed=0 if args.seed is None else args.seed, val_fraction=args.val_fraction)
    manifest = generate(cfg)
    print(json.dumps({"manifest": str(manifest), "count": cfg.count, "seconds": round(time.perf_counter() - start, 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
