"""The measurements of `python -m benchmarks.upsample` (its docstring says what each command measures): quality at
the returned size, the cost of the upsampling step (each size in a fresh process) and the before/after crop."""
from __future__ import annotations

import dataclasses

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from data_tools import synth
from stylevar.baselines.reinhard import reinhard_transfer
from stylevar.processing.images import pil_to_tensor, scaled_size
from stylevar.metrics.structure import edge_correlation
from stylevar.metrics.style_fidelity import colour_swd
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.processing.upsample import Upsampling, upscale
from stylevar.utils.threads import apply_threads
from training.parts import demo_export as demo

ROWS = ("bicubic", "guided", "reinhard")
METRICS = ("edge_corr", "colour_dist_to_style", "colour_swd_to_style")


# ------------------------------------------------------------------------------------------ inputs
def synthetic_pairs(n: int, size: int, seed: int = demo.HELDOUT_SEED) -> list[tuple[Image.Image, Image.Image]]:
    """Held-out contents drawn at `size` (the synthesis is resolution-free) with 64 px styles."""
    styles = [t.style for t in demo.heldout_triplets(n, 64, seed)]
    contents = [Image.fromarray(np.round(synth.make_content(np.random.default_rng([seed, i]), size)).astype(np.uint8))
                for i in range(n)]
    return list(zip(contents, styles))


def photo_pairs(size: int) -> list[tuple[Image.Image, Image.Image]]:
    out = []
    for t in demo.photo_triplets(64):
        out.append((t.content.convert("RGB").resize(scaled_size(t.content.size, size), Image.LANCZOS), t.style))
    return out


# ------------------------------------------------------------------------------------------ quality
SWD_SIDE = 256  # the colour distribution is read from a strided sample of about this many pixels a side


def scores(out: Image.Image, content: Image.Image, style: Image.Image) -> dict[str, float]:
    o, c, s = (pil_to_tensor(im.convert("RGB"))[None] for im in (out, content, style))
    step = max(1, max(o.shape[-2:]) // SWD_SIDE)  # every step-th pixel: the same distribution, fewer points
    return {"edge_corr": float(edge_correlation(o, c)), "colour_dist_to_style": float(demo.mean_colour_distance(o, s)),
            "colour_swd_to_style": float(colour_swd(o[..., ::step, ::step], s))}


@torch.no_grad()
def drawings(pipe: StylePipeline, pairs) -> list[tuple[torch.Tensor, torch.Tensor, object]]:
    """The model's drawing of each pair (`StylePipeline.draw`, seed 0) and what it saw, with its fit."""
    out = []
    for content, style in pairs:
        d = pipe.draw([content], [style], seeds=[0])
        out.append((d.images[0], d.seen[0], d.fits[0]))
    return out


def quality(n: int, sizes: list[int]) -> dict:
    torch.manual_seed(0)
    pipe = StylePipeline.from_pretrained(device="cpu")
    result: dict = {"model": pipe.config.label, "n": n, "sizes": {}}
    for size in sizes:
        per_set = {}
        for name, pairs in (("synthetic", synthetic_pairs(n, size)), ("photos", photo_pairs(size))):
            rows: dict[str, list[dict]] = {r: [] for r in ROWS}
            seconds: dict[str, list[float]] = {"bicubic": [], "guided": []}
            for (content, style), (img, seen, fit) in zip(pairs, drawings(pipe, pairs)):
                for mode in ("bicubic", "guided"):
                    t0 = time.perf_counter()
                    out = upscale(img, seen, fit, content, None, Upsampling(mode=mode))
                    seconds[mode].append(time.perf_counter() - t0)
                    rows[mode].append(scores(out, content, style))
                rows["reinhard"].append(scores(reinhard_transfer(content, style), content, style))
            per_set[name] = {r: {m: statistics.fmean(x[m] for x in v) for m in METRICS} for r, v in rows.items()}
            for mode, s in seconds.items():
                per_set[name][mode]["upsample_s"] = statistics.fmean(s)
        result["sizes"][str(size)] = per_set
        print(f"{size} px done", file=sys.stderr)
    return result


def quality_markdown(result: dict) -> str:
    lines = ["| long side | set | method | edge corr. with content ↑ | colour dist. to style ↓ | colour SWD to style ↓ "
             "| upsampling s/image |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for size, sets in result["sizes"].items():
        for name, rows in sets.items():
            for r, v in rows.items():
                sec = f"{v['upsample_s']:.3f}" if "upsample_s" in v else "-"
                lines.append(f"| {size} | {name} | {r} | {v['edge_corr']:.3f} | {v['colour_dist_to_style']:.3f} | "
                             f"{v['colour_swd_to_style']:.3f} | {sec} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ cost
def status_bytes(key: str) -> int:
    """A /proc/self/status figure (VmRSS: now; VmHWM: this process's peak since exec) in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def cost_once(megapixels: float, mode: str, repeats: int) -> dict:
    """In this process: a 3:2 content of `megapixels`, the upsampling step timed `repeats` times."""
    apply_threads(2)
    w = round((megapixels * 1e6 * 1.5) ** 0.5)
    h = round(w / 1.5)
    content = synthetic_pairs(1, 512)[0][0].resize((w, h), Image.BICUBIC)
    g = torch.Generator().manual_seed(0)
    drawing, seen = torch.rand(3, 64, 64, generator=g), pil_to_tensor(content.resize((64, 64), Image.BICUBIC))
    from stylevar.processing.images import fit_of

    fit = fit_of(content.size, 64, "stretch")
    before = status_bytes("VmRSS")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = upscale(drawing, seen, fit, content, None, Upsampling(mode=mode))
        times.append(time.perf_counter() - t0)
        del out
    peak = status_bytes("VmHWM")  # not ru_maxrss: that counts the parent this process was forked from
    return {"megapixels": w * h / 1e6, "size": [w, h], "mode": mode, "seconds": statistics.median(times),
            "peak_added_mb": (peak - before) / 2**20}


def cost(megapixels: list[float], repeats: int) -> list[dict]:
    rows = []
    for mp in megapixels:
        for mode in ("bicubic", "guided"):
            cmd = [sys.executable, "-m", "benchmarks.upsample", "_cost", str(mp), mode, str(repeats)]
            rows.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
    return rows


def cost_markdown(rows: list[dict]) -> str:
    lines = ["| content | mode | upsampling s (median) | peak added RSS MB |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['size'][0]} x {r['size'][1]} ({r['megapixels']:.1f} MP) | {r['mode']} | {r['seconds']:.2f} | "
              f"{r['peak_added_mb']:.0f} |" for r in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ grid
def crop_grid(out: Path, size: int = 1024, crop: int = 256) -> Path:
    """bicubic | guided | content, a `crop`-pixel window at full size from a photograph at `size` px."""
    pipe = StylePipeline.from_pretrained(device="cpu")
    content, style = photo_pairs(size)[0]
    (img, seen, fit), = drawings(pipe, [(content, style)])
    outs = [upscale(img, seen, fit, content, None, Upsampling(mode=m)) for m in ("bicubic", "guided")] + [content]
    box = (int(content.width * 0.3), int(content.height * 0.15))
    box = (*box, box[0] + crop, box[1] + crop)
    grid = Image.new("RGB", (3 * crop + 2 * 8, crop), "white")
    for i, im in enumerate(outs):
        grid.paste(im.crop(box), (i * (crop + 8), 0))
    out.parent.mkdir(parents=True, exist_ok=True)
    grid.save(out)
    return out


def detail(args) -> dict:
    """`detail`'s rows: each guided-step variant's mean measures on the pairs (`stylevar.evaluate.real_pairs`)."""
    from stylevar.evaluate.real_pairs import RealPairs, Scorer

    pairs = RealPairs.from_folders(args.contents, args.styles, args.photos, args.art).load()
    scorer = Scorer()
    refs = scorer.references([c for c, _ in pairs], [s for _, s in pairs])
    pipe = StylePipeline.from_pretrained(args.model)
    rows = {}
    for variant in args.variants.split(","):
        strength, eps, radius = variant.split(":")
        up = dataclasses.replace(pipe.config.upsample, strength=float(strength), eps=float(eps), radius=int(radius))
        p = StylePipeline(pipe.model, dataclasses.replace(pipe.config, upsample=up))
        out = [p(c, s, seed=i) for i, (c, s) in enumerate(pairs)]
        rows[f"strength {strength}, eps {eps}, radius {radius}"] = {
            k: float(v.mean()) for k, v in scorer(out, refs).items()}
    return {"n_pairs": len(pairs), "contents": str(args.contents), "styles": str(args.styles), "photos": args.photos,
            "art": args.art, "model": args.model or "the demo model", "rows": rows}


def detail_markdown(result: dict) -> str:
    from stylevar.evaluate.real_pairs import ceiling_markdown

    return f"{result['n_pairs']} pairs\n" + ceiling_markdown(result["rows"])

