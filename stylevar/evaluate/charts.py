"""The pictures of an evaluation: the samples grid (Pillow) and one bar chart per metric (matplotlib)."""
from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image, ImageDraw, ImageFont

from stylevar.utils.atomic import atomic_write_path
from stylevar.evaluate.config import higher_better, label
from stylevar.processing.images import tensor_to_pil


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: fixed-size bitmap font
        return ImageFont.load_default()


def draw_grid(grid: dict[str, list[torch.Tensor]], method_names: list[str], paired: bool, cell: int = 160) -> Image.Image:
    """Rows: samples; columns: content | style | target | each method, with a header row of labels."""
    columns = ["content", "style", "target", *method_names]
    rows = len(grid["content"])
    header, pad = 28, 4
    width = len(columns) * (cell + pad) + pad
    img = Image.new("RGB", (width, header + rows * (cell + pad) + pad), "white")
    draw = ImageDraw.Draw(img)
    font = _font(13)
    for j, col in enumerate(columns):
        x = pad + j * (cell + pad)
        label = col if len(col) <= 24 else col[:23] + "…"
        draw.text((x + 2, 7), label, fill="black", font=font)
        for i in range(rows):
            y = header + pad + i * (cell + pad)
            tiles = grid.get(col)
            if tiles is not None and i < len(tiles):
                img.paste(tensor_to_pil(tiles[i]).resize((cell, cell), Image.BICUBIC), (x, y))
            else:
                draw.rectangle([x, y, x + cell - 1, y + cell - 1], fill=(235, 235, 235))
                draw.text((x + 8, y + cell // 2 - 7), "no target" if col == "target" and not paired else "n/a",
                          fill=(120, 120, 120), font=font)
    return img


def save_bar_chart(path: Path, metric: str, rows: list[dict], bench_names: list[str], method_names: list[str]) -> Path:
    """Grouped bars (matplotlib): one group per benchmark, one bar per method, each value printed on its bar."""
    import matplotlib
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt
    values = {(r["benchmark"], r["method"]): r[metric] for r in rows if not isinstance(r[metric], str)}
    width = 0.8 / max(len(method_names), 1)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 + 0.5 * len(bench_names) * max(len(method_names), 1)), 3.6),
                           layout="constrained")
    for k, method in enumerate(method_names):
        xs = [g + (k - (len(method_names) - 1) / 2) * width for g, b in enumerate(bench_names) if (b, method) in values]
        ys = [values[(b, method)] for b in bench_names if (b, method) in values]
        bars = ax.bar(xs, ys, width * 0.9, label=method)
        ax.bar_label(bars, fmt="%.3g", fontsize=8)
    ax.set_xticks(range(len(bench_names)), bench_names)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_title(f"{label(metric)} ({'higher' if higher_better(metric) else 'lower'} is better)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    try:
        atomic_write_path(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    finally:
        plt.close(fig)
    return path


def save_png(img: Image.Image, path: Path) -> Path:
    """Write ``img`` to ``path`` as PNG, whole or not at all."""
    return atomic_write_path(path, lambda tmp: img.save(tmp, format="PNG"))
