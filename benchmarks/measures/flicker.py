"""The measurements of `python -m benchmarks.flicker` (its docstring says what and how): clips with known
motion, each temporal mode's flicker, edge correlation, colour distance and speed, the table and the frames figure."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw

from stylevar.pipelines.coherence import Coherence
from stylevar.processing.images import pil_to_tensor, tensor_to_pil
from stylevar.runtime.inference import InferenceConfig, prepare
from stylevar.metrics.structure import edge_correlation
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.processing.video import VideoWriter, read_frames
from stylevar.utils.threads import apply_threads
from training.parts.demo_export import mean_colour_distance

REPO = Path(__file__).resolve().parents[2]
PHOTOS = REPO / "stylevar" / "assets" / "photos"
STYLES = REPO / "stylevar" / "assets" / "examples"
FPS = 12
Warp = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # (B, 3, H, W) -> (moved, valid (B, 1, H, W))


@dataclass(frozen=True)
class Clip:
    name: str
    frames: list[Image.Image]
    warps: list[Warp | None]  # warps[t]: frame t-1 moved onto frame t (None: a cut, left out)


def shift_warp(dx: int, dy: int) -> Warp:
    """The content moved by (dx, dy) whole pixels on the screen: out(p) = prev(p - d)."""
    def warp(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        moved = torch.roll(x, shifts=(dy, dx), dims=(2, 3))
        valid = torch.zeros_like(x[:, :1], dtype=torch.bool)
        H, W = x.shape[2:]
        valid[:, :, max(dy, 0):H + min(dy, 0), max(dx, 0):W + min(dx, 0)] = True
        return moved, valid
    return warp


def pan(name: str, photo: str, size: tuple[int, int], start: tuple[int, int], step: tuple[int, int], n: int) -> Clip:
    img = Image.open(PHOTOS / f"{photo}.png").convert("RGB")
    (w, h), (x0, y0), (sx, sy) = size, start, step
    frames = [img.crop((x0 + t * sx, y0 + t * sy, x0 + t * sx + w, y0 + t * sy + h)) for t in range(n)]
    return Clip(name, frames, [None] + [shift_warp(-sx, -sy)] * (n - 1))


def zoom(name: str, photo: str, size: tuple[int, int], n: int, end_scale: float = 1.35) -> Clip:
    """The window shrinks about the centre from the whole photograph to 1 / end_scale of it."""
    img = Image.open(PHOTOS / f"{photo}.png").convert("RGB")
    W, H = img.size
    scales = [end_scale ** (t / (n - 1)) for t in range(n)]
    frames = []
    for s in scales:
        cw, ch = W / s, H / s
        box = ((W - cw) / 2, (H - ch) / 2, (W + cw) / 2, (H + ch) / 2)
        frames.append(img.resize(size, Image.LANCZOS, box=box))
    warps: list[Warp | None] = [None] + [scale_warp(scales[t] / scales[t - 1]) for t in range(1, n)]
    return Clip(name, frames, warps)


def scale_warp(factor: float) -> Warp:
    """Magnified by `factor` about the centre: out(p) = prev(c + (p - c) / factor), bilinear."""
    def warp(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        theta = torch.tensor([[1 / factor, 0, 0], [0, 1 / factor, 0]], dtype=torch.float32).expand(x.shape[0], 2, 3)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        valid = (grid.abs() <= 1).all(-1).unsqueeze(1)
        return F.grid_sample(x, grid, mode="bilinear", align_corners=False), valid
    return warp


def clips(n: int) -> list[Clip]:
    half = n // 2
    first, second = pan("a", "coffee", (160, 112), (20, 20), (3, 0), half), pan("b", "rocket", (160, 112), (10, 10), (3, 1), n - half)
    return [pan("pan right", "chelsea", (160, 112), (20, 20), (3, 0), n),
            pan("pan down", "astronaut", (144, 144), (40, 10), (0, 3), n),
            pan("pan diagonal", "coffee", (160, 112), (40, 20), (2, 1), n),
            zoom("zoom", "rocket", (160, 106), n),
            Clip("cut", first.frames + second.frames, first.warps + [None] + second.warps[1:])]


def write_clip(clip: Clip, path: Path) -> Path:
    with VideoWriter(path, FPS) as w:
        for frame in clip.frames:
            w.write(frame)
    return path


def tensors(path: Path) -> torch.Tensor:
    return torch.stack([pil_to_tensor(im) for im in read_frames(path)])


def flicker(frames_T3HW: torch.Tensor, warps: list[Warp | None]) -> float:
    """Mean |f_t - warp_t(f_{t-1})| over the valid pixels, 8-bit levels, averaged over the pairs with a warp."""
    H, W = frames_T3HW.shape[2:]
    values = []
    for t, warp in enumerate(warps):
        if warp is None:
            continue
        moved, valid = warp(frames_T3HW[t - 1:t, :, :H, :W])
        diff = (frames_T3HW[t:t + 1] - moved).abs().mean(1, keepdim=True)
        values.append(float(diff[valid].mean()) * 255)
    return float(np.mean(values))


ABLATION = {  # the coherent sampler's parts one by one (the modes' own settings: stylevar.pipelines.coherence.coherence_of)
    "keyed noise, not anchored": Coherence(anchor=False),
    "anchored noise": Coherence(anchor=True),
    "anchored + blend 0.5": Coherence(anchor=True, blend=0.5),
    "anchored + settle, no canvas": Coherence(anchor=True, settle=0.5),
    "anchored + canvas": Coherence(anchor=True, align=True, align_scale=-2),
    "anchored + canvas + reuse": Coherence(anchor=True, align=True, align_scale=-2, reuse_scales=-1),
    "canvas + settle, not anchored": Coherence(anchor=False, align=True, align_scale=-2, settle=0.5),
    "coherent, canvas on the finest scale": Coherence(anchor=True, align=True, align_scale=-1, settle=0.5),
    "coherent + blend 0.5": Coherence(anchor=True, align=True, align_scale=-2, settle=0.5, blend=0.5),
}


class ClipContent:
    """A test clip's decoded content frames, decoded once, and its own flicker per output size (the content is
    cropped to the stylized frames' size, the same for every mode, style and seed)."""

    def __init__(self, clip: Clip, src: Path):
        self.clip, self.src, self.frames = clip, src, tensors(src)
        self._flicker: dict[tuple[int, int], float] = {}

    def cropped(self, h: int, w: int) -> tuple[torch.Tensor, float]:
        content = self.frames[:, :, :h, :w]
        if (h, w) not in self._flicker:
            self._flicker[(h, w)] = flicker(content, self.clip.warps)
        return content, self._flicker[(h, w)]


def measure(pipe: StylePipeline, clip: ClipContent, style: Image.Image, mode, seed: int, out: Path) -> dict:
    result = pipe.stylize_video(clip.src, style, out, temporal=mode, seed=seed)
    frames = tensors(out)
    content, content_flicker = clip.cropped(frames.shape[2], frames.shape[3])
    style_t = pil_to_tensor(style)[None]
    return {"flicker": flicker(frames, clip.clip.warps),
            "edge_corr": float(edge_correlation(frames, content).mean()),
            "colour_dist": float(mean_colour_distance(frames, style_t.expand(len(frames), -1, -1, -1)).mean()),
            "sec_per_frame": result.seconds / result.frames,
            "content_flicker": content_flicker}


def run(pipe: StylePipeline, n: int, seeds: list[int], styles: list[str], modes: dict, work: Path,
        names: list[str] | None = None) -> dict:
    """rows[clip][mode] = the metrics' means over styles and seeds; the modes take turns per (clip, style, seed)."""
    rows: dict[str, dict[str, dict[str, list[float]]]] = {}
    for clip in (c for c in clips(n) if names is None or c.name in names):
        content = ClipContent(clip, write_clip(clip, work / f"{clip.name.replace(' ', '_')}.mp4"))
        acc = rows.setdefault(clip.name, {})
        for style_name in styles:
            style = Image.open(STYLES / f"{style_name}.png").convert("RGB")
            for seed in seeds:
                for name, mode in modes.items():
                    out = work / "out.mp4"
                    m = measure(pipe, content, style, mode, seed, out)
                    for key, value in m.items():
                        acc.setdefault(name, {}).setdefault(key, []).append(value)
                    print(f"{clip.name:12s} {style_name:12s} seed {seed} {name:28s} "
                          + " ".join(f"{k} {v:.4f}" for k, v in m.items()), file=sys.stderr, flush=True)
    return {clip: {mode: {k: float(np.mean(v)) for k, v in m.items()} for mode, m in by_mode.items()}
            for clip, by_mode in rows.items()}


def markdown(table: dict, header: str) -> str:
    """One row per (clip, mode): the figures, flicker against same-seed's, edge correlation and colour distance
    against independent's (per-frame stylization); then the pans' means."""
    lines = [header, "", "| clip | mode | flicker ↓ | vs same-seed | edge corr ↑ | Δ edge corr | colour dist ↓ | "
             "Δ colour dist | s / frame | content flicker |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | "
             "---: | ---: |"]
    pans = [c for c in table if c.startswith("pan")]
    if pans:
        modes = list(table[pans[0]])
        table = {**table, "pans (mean)": {mode: {k: float(np.mean([table[c][mode][k] for c in pans]))
                                                for k in table[pans[0]][mode]} for mode in modes}}
    for clip, by_mode in table.items():
        base, per_frame = by_mode.get("same-seed"), by_mode.get("independent")
        for mode, m in by_mode.items():
            rel = f"{100 * (m['flicker'] / base['flicker'] - 1):+.0f} %" if base else ""
            d_edge = f"{m['edge_corr'] - per_frame['edge_corr']:+.3f}" if per_frame else ""
            d_colour = f"{m['colour_dist'] - per_frame['colour_dist']:+.3f}" if per_frame else ""
            lines.append(f"| {clip} | {mode} | {m['flicker']:.2f} | {rel} | {m['edge_corr']:.3f} | {d_edge} | "
                         f"{m['colour_dist']:.3f} | {d_colour} | {m['sec_per_frame']:.3f} | "
                         f"{m['content_flicker']:.2f} |")
    return "\n".join(lines) + "\n"


def frames_png(pipe: StylePipeline, n: int, style_name: str, modes: list[str], seed: int, path: Path,
               columns: tuple[int, ...] = (9, 10, 11)) -> Path:
    """The pan-right clip: the content and each mode's frames (columns), each with the amplified difference to
    the previous frame moved by the known motion (x4) beside it; frame 11 is a step of the coherent canvas."""
    clip = clips(n)[0]
    style = Image.open(STYLES / f"{style_name}.png").convert("RGB")
    with tempfile.TemporaryDirectory() as tmp:
        src = write_clip(clip, Path(tmp) / "clip.mp4")
        rows = [("content", tensors(src))]
        for mode in modes:
            out = Path(tmp) / f"{mode}.mp4"
            pipe.stylize_video(src, style, out, temporal=mode, seed=seed)
            rows.append((mode, tensors(out)))
    H, W = rows[0][1].shape[2:]
    label_w, gap, top = 120, 4, 16
    sheet = Image.new("RGB", (label_w + len(columns) * 2 * (W + gap), top + len(rows) * (H + gap)), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for c, t in enumerate(columns):
        x = label_w + c * 2 * (W + gap)
        draw.text((x + 4, 2), f"frame {t}", fill=(0, 0, 0))
        draw.text((x + W + gap + 4, 2), f"|frame {t} - moved frame {t - 1}| x 4", fill=(0, 0, 0))
    for r, (name, frames) in enumerate(rows):
        y = top + r * (H + gap)
        draw.text((4, y + H // 2 - 6), name, fill=(0, 0, 0))
        for c, t in enumerate(columns):
            x = label_w + c * 2 * (W + gap)
            sheet.paste(tensor_to_pil(frames[t]), (x, y))
            moved, valid = clip.warps[t](frames[t - 1:t, :, :H, :W])
            diff = ((frames[t:t + 1] - moved).abs() * 4).clamp(0, 1) * valid
            sheet.paste(tensor_to_pil(diff[0]), (x + W + gap, y))
    path.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(path, optimize=True)
    return path


def parse_seeds(text: str) -> list[int]:
    if "-" in text:
        first, last = text.split("-")
        return list(range(int(first), int(last) + 1))
    return [int(s) for s in text.split(",")]


def execute(args: argparse.Namespace, argv: list[str] | None) -> int:
    """`python -m benchmarks.flicker` once its options (``args``, parsed from ``argv``) are read: the clips, the
    table (printed, and written where asked) and the frames figure."""
    apply_threads(args.threads)
    pipe = StylePipeline.from_pretrained(device="cpu")
    prepare(pipe.model, InferenceConfig())  # as the command line runs it on the CPU
    modes = {m: m for m in args.modes.split(",")} | (ABLATION if args.ablation else {})
    seeds = parse_seeds(args.seeds)
    load = os.getloadavg()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        table = run(pipe, args.frames, seeds, args.styles.split(","), modes, Path(tmp),
                    None if args.clips is None else args.clips.split(","))
    header = (f"Demo model on the CPU ({args.threads} thread(s)), {args.frames} frames at {FPS} fps per clip, styles "
              f"{args.styles}, seeds {args.seeds}; load average {load[0]:.2f} at the start; "
              f"{time.perf_counter() - t0:.0f} s in all. Command: `python -m benchmarks.flicker "
              f"{' '.join(argv if argv is not None else sys.argv[1:])}`")
    text = markdown(table, header)
    print(text)
    if args.out:
        args.out.write_text(json.dumps({"header": header, "table": table}, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(text)
    if args.png:
        frames_png(pipe, args.frames, args.styles.split(",")[0], args.modes.split(","), seeds[0], args.png)
    return 0

