"""`run`: every method on every benchmark, scored per sample, averaged per benchmark and method.

Every check runs before any model or metric loads. Under torchrun the batches are shared out among the processes
and process 0 merges the records and writes the files; every process returns the merged result.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch

from stylevar.loaders import weights
from stylevar.utils.devices import resolve_device
from stylevar.evaluate.benchmarks import Benchmark, Triplets, load_benchmark
from stylevar.evaluate.config import MISSING, TIME, EvalConfig, RunResult
from stylevar.evaluate.methods import Method, make_method, unique_names
from stylevar.evaluate.report import write_outputs
from stylevar.evaluate.scoring import Scored, device_name, score_batches
from stylevar.evaluate.ranks import Shard, start_shard
from stylevar.metrics.definitions import weights_for
from stylevar.metrics import MetricSuite
from stylevar.loaders.preflight import output_folder
from stylevar.utils.extras import install_line


class MissingWeightsError(RuntimeError):
    """Weights needed by the requested metrics or methods are absent (listed with the fix)."""

    def __init__(self, gone: dict[str, weights.MissingWeightError], needed_by: dict[str, list[str]],
                 blocked: list[str]):
        self.gone = gone
        lines = ["missing weights:"]
        for name, err in gone.items():
            w = err.weight
            lines.append(f"  - {name} ({w.filename}), needed by {', '.join(needed_by[name])}; looked in:")
            lines += [f"      {p}" for p in err.searched]
        fetchable = [n for n, e in gone.items() if e.weight.downloadable]
        if fetchable:
            lines.append(f"fetch them (needs internet) with: stylevar weights fetch {' '.join(fetchable)}")
        for n, e in gone.items():
            if not e.weight.downloadable:
                lines.append(f"{n}: {e.weight.note}")
        if blocked:
            lines.append(f"or compare with a method that needs no download instead of {', '.join(blocked)}: "
                         f"--method magenta (its network comes with {install_line('teacher')}) or --method "
                         "reinhard")
        lines.append("or pass --allow-missing to skip the metrics and methods that need them")
        super().__init__("\n".join(lines))


def check_weights(cfg: EvalConfig, methods: list[Method]) -> dict[str, weights.MissingWeightError]:
    """The absent weights of the metrics and methods (MissingWeightsError unless ``cfg.allow_missing``)."""
    needed_by: dict[str, list[str]] = {}
    for m in cfg.metrics:
        for w in weights_for(m, cfg.lpips_net):
            needed_by.setdefault(w, []).append(m)
    for method in methods:
        for w in method.weights:
            needed_by.setdefault(w, []).append(method.name)
    gone = weights.missing(needed_by)
    if gone and not cfg.allow_missing:
        raise MissingWeightsError(gone, needed_by, [m.name for m in methods if set(m.weights) & set(gone)])
    return gone


@dataclass
class _Run:
    """What scoring a benchmark needs: config, metrics, shard, device, progress bar and the result."""

    cfg: EvalConfig
    suite: MetricSuite
    shard: Shard
    device: torch.device
    bar: Any  # tqdm
    result: RunResult


def run(cfg: EvalConfig) -> RunResult:
    """Evaluate every method on every benchmark and write the outputs to `cfg.out` (see the module doc)."""
    from tqdm.auto import tqdm

    # every check before any model or metric loads
    output_folder(cfg.out, "--out folder")
    shard, device = start_shard(resolve_device(cfg.device))
    methods = [make_method(spec) for spec in cfg.methods]
    unique_names(methods)
    benchmarks = [load_benchmark(name, src, split=cfg.split, n=cfg.n, seed=cfg.seed) for name, src in cfg.benchmarks]
    gone = check_weights(cfg, methods)
    result = RunResult()
    runnable = []
    for m in methods:
        absent = [w for w in m.weights if w in gone]
        if absent:
            result.skipped_methods[m.name] = ", ".join(absent)
        else:
            runnable.append(m)
    suite = MetricSuite(cfg.metrics, device=device, lpips_net=cfg.lpips_net, batch_size=cfg.batch_size,
                        allow_missing=cfg.allow_missing, image_size=cfg.image_size)
    result.skipped_metrics = {k: v.weight.name for k, v in suite.skipped.items()}
    for m in runnable:
        m.load(device)
    total = sum(len(shard.batches(len(b.samples), cfg.batch_size)) for b in benchmarks) * len(runnable)
    bar = tqdm(total=total, desc="evaluate", unit="batch", disable=not (cfg.progress and shard.main), file=sys.stderr)
    state = _Run(cfg, suite, shard, device, bar, result)
    grids = {bench.name: _evaluate_benchmark(state, bench, runnable) for bench in benchmarks}
    bar.close()
    result.rank = shard.rank
    result.shortfalls = shortfalls(cfg, benchmarks, len(methods), result)
    if shard.main:
        result.files += write_outputs(cfg, benchmarks, methods, runnable, result, grids, device_name(device))
    shard.close()
    return result


def shortfalls(cfg: EvalConfig, benchmarks: list[Benchmark], methods: int, result: RunResult) -> list[str]:
    """Why the tables have fewer rows than asked: a benchmark with fewer than `cfg.n` rows, a method not run."""
    notes = [f"{b.name}: {len(b.samples)} of {cfg.n} rows: {cfg.n - len(b.samples)} pairs not drawn because split "
             f"`{cfg.split}` of {b.manifest} has only {b.total}" + ("" if cfg.split == "all" else " (--split all)")
             for b in benchmarks if len(b.samples) < cfg.n]
    if result.skipped_methods:
        asked = len(benchmarks) * methods
        notes.append(f"{asked - len(benchmarks) * len(result.skipped_methods)} of {asked} benchmark x method rows: "
                     + "; ".join(f"{name} not run because weights {absent} are missing"
                                 for name, absent in result.skipped_methods.items()))
    return notes


def _evaluate_benchmark(state: _Run, bench: Benchmark, methods: list[Method]) -> dict[str, list[torch.Tensor]]:
    """Score every method on one benchmark into ``state.result``; returns its samples grid."""
    data = Triplets.load(bench, state.cfg.image_size, state.cfg.seed)
    rows = min(state.cfg.grid_rows, len(bench.samples))
    grid = data.grid(rows)
    for method in methods:
        state.bar.set_description(f"{bench.name} / {method.name}")
        scored = _score_method(state, method, data, keep=rows)
        records = state.shard.gather(list(zip(scored.positions, scored.records(), scored.seconds)))
        outputs = dict(state.shard.gather(list(scored.outputs.items())))
        grid[method.name] = [outputs[p] for p in range(rows)]
        mine = [_sample_record(state, bench, method, data.seeds[pos], pos, scores, seconds)
                for pos, scores, seconds in sorted(records, key=lambda r: r[0])]
        state.result.samples += mine
        state.result.rows.append(_mean_row(state, bench, method, mine))
    return grid


def _score_method(state: _Run, method: Method, data: Triplets, keep: int) -> Scored:
    """This process's batches of one method on one benchmark (after one untimed call, when warming up)."""
    device, suite = state.device, state.suite
    if state.cfg.warmup:
        with torch.no_grad():
            method(data.content[:1].to(device), data.style[:1].to(device), data.seeds[:1])  # untimed

    def generate(sl: slice) -> torch.Tensor:
        return method(data.content[sl].to(device), data.style[sl].to(device), data.seeds[sl])

    def score(gen: torch.Tensor, sl: slice) -> dict[str, torch.Tensor]:
        return suite(gen, data.content[sl].to(device), data.style[sl].to(device),
                     data.target[sl].to(device) if data.target is not None else None)

    return score_batches(state.shard.batches(len(data.seeds), state.cfg.batch_size), generate, score, device,
                         keep=keep, on_batch=lambda: state.bar.update(1))


def _sample_record(state: _Run, bench: Benchmark, method: Method, seed: int, pos: int, scores: dict[str, float],
                   seconds: float) -> dict:
    """One line of per_sample.jsonl."""
    sample = bench.samples[pos]
    return {"benchmark": bench.name, "method": method.name, "id": sample.id, "index": sample.index,
            "content": str(sample.content), "style": str(sample.style),
            "target": str(sample.target) if sample.target else None, "seed": seed,
            **{k: scores[k] for k in state.suite.metrics}, **dict.fromkeys(state.result.skipped_metrics, MISSING),
            TIME: seconds}


def _mean_row(state: _Run, bench: Benchmark, method: Method, records: list[dict]) -> dict:
    """One row of the results tables: the method's mean of each metric (and time) on the benchmark."""
    row = {"benchmark": bench.name, "method": method.name, "paired": bench.paired, "n": len(bench.samples)}
    for k in state.cfg.metrics:
        row[k] = sum(r[k] for r in records) / len(records) if k in state.suite.metrics else MISSING
    row[TIME] = sum(r[TIME] for r in records) / len(records)
    return row
