"""The files of an evaluation: results.csv, results.md, per_sample.jsonl, the sample grids and the charts, each
written whole or not at all.
"""
from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import torch

from stylevar.utils.atomic import atomic_write_text
from stylevar.evaluate.benchmarks import Benchmark
from stylevar.evaluate.charts import draw_grid, save_bar_chart, save_png
from stylevar.evaluate.config import MISSING, TIME, EvalConfig, RunResult, higher_better, label
from stylevar.evaluate.methods import Method


def write_outputs(cfg: EvalConfig, benchmarks: list[Benchmark], methods: list[Method], runnable: list[Method],
                  result: RunResult, grids: dict[str, dict[str, list[torch.Tensor]]], device: str) -> list[Path]:
    """The tables, the sample grids and the charts in `cfg.out`."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    files = write_tables(cfg, benchmarks, methods, result, out, device)
    for bench in benchmarks:
        grid = draw_grid(grids[bench.name], [m.name for m in runnable], bench.paired)
        files.append(save_png(grid, out / f"samples_{_slug(bench.name)}.png"))
    for k in (*cfg.metrics, TIME):
        if k in result.skipped_metrics:
            continue
        files.append(save_bar_chart(out / f"chart_{k}.png", k, result.rows, [b.name for b in benchmarks],
                                    [m.name for m in runnable]))
    return files


def write_tables(cfg: EvalConfig, benchmarks: list[Benchmark], methods: list[Method], result: RunResult,
                 out: Path, device_name: str) -> list[Path]:
    """results.csv, results.md and per_sample.jsonl in ``out``."""
    csv_path = atomic_write_text(out / "results.csv", results_csv(cfg, benchmarks, result))
    jsonl_path = atomic_write_text(out / "per_sample.jsonl", "".join(json.dumps(rec) + "\n" for rec in result.samples))
    md = ["# Evaluation", "", *markdown_table(cfg, benchmarks, result), "", "Notes:",
          *markdown_notes(cfg, benchmarks, methods, result, device_name)]
    md_path = atomic_write_text(out / "results.md", "\n".join(md) + "\n")
    return [csv_path, md_path, jsonl_path]


def results_csv(cfg: EvalConfig, benchmarks: list[Benchmark], result: RunResult) -> str:
    """One line per benchmark x method (and per method not run, for lack of weights)."""
    columns = [*cfg.metrics, TIME]
    text = io.StringIO(newline="")
    w = csv.writer(text)
    w.writerow(["benchmark", "method", "paired", "n", *columns, "note"])
    for r in result.rows:
        w.writerow([r["benchmark"], r["method"], r["paired"], r["n"],
                    *[r[k] if isinstance(r[k], str) else f"{r[k]:.6g}" for k in columns], ""])
    for name, absent in result.skipped_methods.items():
        for b in benchmarks:
            w.writerow([b.name, name, b.paired, 0, *[MISSING] * len(columns), f"not run: missing weights {absent}"])
    return text.getvalue()


def markdown_table(cfg: EvalConfig, benchmarks: list[Benchmark], result: RunResult) -> list[str]:
    """The lines of results.md's table: arrows in the header, each benchmark's best value in bold."""
    columns = [*cfg.metrics, TIME]
    md = ["| Benchmark | Method | " + " | ".join(f"{label(k)} {'↑' if higher_better(k) else '↓'}" for k in columns)
          + " |", "|---|---|" + "---:|" * len(columns)]
    for bench in benchmarks:
        rows = [r for r in result.rows if r["benchmark"] == bench.name]
        best = {}
        for k in columns:
            vals = [r[k] for r in rows if not isinstance(r[k], str)]
            if vals:
                best[k] = max(vals) if higher_better(k) else min(vals)
        kind = "paired" if bench.paired else "unpaired"
        for r in rows:
            cells = [_fmt(r[k]) for k in columns]
            cells = [f"**{c}**" if not isinstance(r[k], str) and len(rows) > 1 and r[k] == best.get(k) else c
                     for k, c in zip(columns, cells)]
            md.append(f"| {bench.name} ({kind}, n={r['n']}) | {r['method']} | " + " | ".join(cells) + " |")
        for name in result.skipped_methods:
            md.append(f"| {bench.name} ({kind}) | {name} | " + " | ".join(["not run"] * len(columns)) + " |")
    return md


def markdown_notes(cfg: EvalConfig, benchmarks: list[Benchmark], methods: list[Method], result: RunResult,
                   device_name: str) -> list[str]:
    """The notes under results.md's table: how rows were drawn and compared, the methods, what is missing."""
    paper = " (the paper's setting)." if cfg.image_size == 256 else " (the paper uses 256: these numbers are not comparable)."
    md = [f"- Rows drawn per benchmark: up to {cfg.n} from split `{cfg.split}` with seed {cfg.seed}; "
          f"images resized to {cfg.image_size}x{cfg.image_size}" + paper,
          "- Paired benchmarks: LPIPS, SSIM, DreamSim and CLIP compare the result to the target; unpaired: to "
          "the content. Style loss is against the style image, content loss against the content image.",
          f"- LPIPS backbone: {cfg.lpips_net}. SSIM is the paper's zero-padded SSIM"
          + ("; SSIM (valid) is torchmetrics' valid-region SSIM." if "ssim_standard" in cfg.metrics else "."),
          "- Time: seconds per image of the method's own inference (batch size "
          f"{cfg.batch_size}{', after one untimed warm-up call' if cfg.warmup else ', no warm-up'}, "
          f"on {device_name}), not of the metrics."]
    md += [f"- {bench.name}: `{bench.manifest}` ({bench.total} rows in split `{cfg.split}`)." for bench in benchmarks]
    seen = set()
    for m in methods:
        if m.name not in seen:
            seen.add(m.name)
            md.append(f"- {m.name}: {m.description}.")
    md += [f"- {label(k)}: `{MISSING}`, weight `{w}` not present (`stylevar weights fetch {w}`)."
           for k, w in result.skipped_metrics.items()]
    md += [f"- {note}." for note in result.shortfalls]
    return md


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "benchmark"


def _fmt(v) -> str:
    return v if isinstance(v, str) else f"{v:.4g}"
