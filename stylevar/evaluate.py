"""`stylevar evaluate`: methods side by side on benchmark triplets, the StyleVAR paper's Table 1 metrics.

For each benchmark (a triplet manifest, see ARCHITECTURE.md) `n` rows are drawn with the seed; every
method stylises the same 256 x 256 content/style pairs; the metrics of `stylevar.metrics` are computed
(paired benchmarks compare to the target, unpaired ones to the content) with the seconds per image of
each method's own inference (CUDA synchronised, after one untimed warm-up call).

Methods: a model directory (through `StylePipeline.from_pretrained`) or a hub id `hf:OWNER/NAME[:variant]`
(pulled on first use), `adain` (AdaIN with its own `vgg_normalised.pth` encoder: the correct baseline),
`adain-paper` (AdaIN on torchvision VGG-19 with unnormalised input, as the StyleVAR paper's evaluation ran
it: to reproduce Table 1), `reinhard` (Lab colour transfer, no weights).

Writes to OUT: `results.csv`, `results.md` (benchmark x method rows, arrows, best in bold),
`per_sample.jsonl`, `samples_<benchmark>.png` (content | style | target | each method) and
`chart_<metric>.png` (one bar chart per metric, time included).
Missing weights stop the run before any work (exit status 3) unless `--allow-missing`, which skips the
metrics (and methods) that need them and marks them `missing`.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

import torch
from PIL import Image, ImageDraw, ImageFont

from stylevar import hub, weights
from stylevar.devices import resolve_device
from stylevar.images import load_image, pil_to_tensor, tensor_to_pil
from stylevar.manifest import manifest_path, read_manifest
from stylevar.metrics import METRICS, NAMES, PAPER_METRICS, MetricSuite, weights_for
from stylevar.preflight import output_folder

BUILTIN_METHODS = ("adain", "adain-paper", "reinhard")
TIME = "seconds_per_image"
SPLITS = ("val", "train", "all")
MISSING = "missing"
EXIT_MISSING_WEIGHTS = 3
T = TypeVar("T")


class MissingWeightsError(RuntimeError):
    """Weights needed by the requested metrics or methods are absent (listed with the fix)."""

    def __init__(self, gone: dict[str, weights.MissingWeightError], needed_by: dict[str, list[str]]):
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
        lines.append("or pass --allow-missing to skip the metrics and methods that need them")
        super().__init__("\n".join(lines))


# ------------------------------------------------------------------------------------------------ config


@dataclass(frozen=True)
class EvalConfig:
    methods: tuple[str, ...]  # model directories or BUILTIN_METHODS
    benchmarks: tuple[tuple[str, str], ...]  # (name, manifest file or folder holding manifest.jsonl)
    out: str
    n: int = 50
    seed: int = 42
    metrics: tuple[str, ...] = PAPER_METRICS
    split: str = "val"  # val | train | all
    device: str | None = None  # default: cuda if available
    allow_missing: bool = False
    batch_size: int = 4
    lpips_net: str = "vgg"
    image_size: int = 256  # the paper's 256; smaller only for smoke tests
    grid_rows: int = 4
    warmup: bool = True  # one untimed call per method and benchmark before timing
    progress: bool = True

    def __post_init__(self) -> None:
        if not self.methods:
            raise ValueError("give at least one --method")
        if not self.benchmarks:
            raise ValueError("give at least one --benchmark NAME=MANIFEST_OR_ROOT")
        names = [b for b, _ in self.benchmarks]
        if len(set(names)) != len(names):
            raise ValueError(f"benchmark names must be unique, got {names}")
        if self.n < 1 or self.batch_size < 1 or self.image_size < 32 or self.grid_rows < 0:
            raise ValueError("--n and --batch-size must be >= 1, --image-size >= 32, --grid-rows >= 0")
        if self.split not in SPLITS:
            raise ValueError(f"--split must be one of {SPLITS}, not {self.split!r}")
        for m in self.metrics:
            if m not in METRICS:
                raise ValueError(f"unknown metric {m!r}; choose from {', '.join(NAMES)}")


# ------------------------------------------------------------------------------------------------ benchmarks


@dataclass(frozen=True)
class Sample:
    index: int  # line number in the manifest (0-based, blank lines skipped)
    id: str
    content: Path
    style: Path
    target: Path | None


@dataclass(frozen=True)
class Benchmark:
    name: str
    manifest: Path
    samples: tuple[Sample, ...]
    paired: bool
    total: int  # rows of the requested split before drawing n


def load_benchmark(name: str, source: str | Path, *, split: str, n: int, seed: int | None) -> Benchmark:
    """Read a manifest, keep the split, draw `n` rows with `seed` (None: the first `n`; all when fewer),
    check the files."""
    path = manifest_path(source)
    base = path.parent
    rows = [Sample(i, e.id, base / e.content, base / e.style, base / e.target if e.target else None)
            for i, e in enumerate(read_manifest(path)) if split == "all" or e.split == split]
    if not rows:
        raise ValueError(f"benchmark {name}: {path} has no rows in split {split!r} (try --split all)")
    with_target = sum(s.target is not None for s in rows)
    if 0 < with_target < len(rows):
        raise ValueError(f"benchmark {name}: {with_target} of {len(rows)} rows have a target; a benchmark must be "
                         "all paired or all unpaired (split it into two manifests)")
    if len(rows) <= n:
        picked = list(range(len(rows)))
    else:
        picked = list(range(n)) if seed is None else sorted(random.Random(seed).sample(range(len(rows)), n))
    samples = tuple(rows[i] for i in picked)
    absent = [str(p) for s in samples for p in (s.content, s.style, s.target) if p is not None and not p.is_file()]
    if absent:
        raise FileNotFoundError(f"benchmark {name}: {len(absent)} image(s) not found, e.g. {', '.join(absent[:3])}")
    return Benchmark(name, path, samples, paired=with_target > 0, total=len(rows))


def load_tensor(path: Path, size: int) -> torch.Tensor:
    """Image file -> (3, size, size) in [0, 1] (RGB, EXIF-oriented, bicubic resize)."""
    return pil_to_tensor(load_image(path).resize((size, size), Image.BICUBIC))


# ------------------------------------------------------------------------------------------------ methods


class Method(Protocol):
    name: str  # short label for tables
    description: str
    weights: tuple[str, ...]  # registry weights it needs

    def load(self, device: torch.device) -> None: ...

    def __call__(self, content_B3HW: torch.Tensor, style_B3HW: torch.Tensor, seeds: list[int]) -> torch.Tensor:
        """Stylised images (B, 3, H, W) in [0, 1], same size as the content."""
        ...


@dataclass
class AdaINMethod:
    encoder: str  # "vgg_normalised" | "torchvision"
    name: str = ""
    description: str = ""
    weights: tuple[str, ...] = ()
    model: torch.nn.Module | None = None

    def __post_init__(self) -> None:
        paper = self.encoder == "torchvision"
        self.name = "AdaIN (paper eval)" if paper else "AdaIN"
        self.description = (
            "AdaIN with torchvision VGG-19 on unnormalised [0, 1] input, as the StyleVAR paper's evaluation "
            "ran it (decoder.pth was not trained with this encoder; kept to reproduce Table 1)"
            if paper else "AdaIN with its original vgg_normalised.pth encoder and decoder.pth (the correct baseline)")
        self.weights = ("adain_decoder", "vgg19") if paper else ("adain_decoder", "adain_vgg")

    def load(self, device: torch.device) -> None:
        from stylevar.baselines.adain import AdaIN

        if self.model is None:
            self.model = AdaIN.from_registry(self.encoder).to(device)  # type: ignore[arg-type]

    def __call__(self, content_B3HW, style_B3HW, seeds):
        assert self.model is not None
        return self.model.stylize(content_B3HW, style_B3HW, alpha=1.0)


@dataclass
class ReinhardMethod:
    name: str = "Reinhard"
    description: str = "Reinhard et al. colour transfer (Lab mean/std; no weights)"
    weights: tuple[str, ...] = ()

    def load(self, device: torch.device) -> None:
        pass

    def __call__(self, content_B3HW, style_B3HW, seeds):
        from stylevar.baselines.reinhard import reinhard_transfer

        out = [pil_to_tensor(reinhard_transfer(tensor_to_pil(c), tensor_to_pil(s)))
               for c, s in zip(content_B3HW.cpu(), style_B3HW.cpu())]
        return torch.stack(out).to(content_B3HW.device)


@dataclass
class PipelineMethod:
    model_dir: Path
    name: str = ""
    description: str = ""
    weights: tuple[str, ...] = ()
    pipe: object | None = None

    def __post_init__(self) -> None:
        from stylevar.pipeline import check_model_dir

        config = check_model_dir(self.model_dir)  # an incomplete folder: one error naming what it lacks
        self.name = config.label
        self.description = f"StyleVAR model directory {self.model_dir}"

    def load(self, device: torch.device) -> None:
        from stylevar.pipeline import StylePipeline

        if self.pipe is None:
            self.pipe = StylePipeline.from_pretrained(self.model_dir, device=device)

    def __call__(self, content_B3HW, style_B3HW, seeds):
        contents = [tensor_to_pil(c) for c in content_B3HW]
        styles = [tensor_to_pil(s) for s in style_B3HW]
        outs = self.pipe.stylize_batch(contents, styles, seeds=seeds, resize="stretch")  # type: ignore[union-attr]
        size = content_B3HW.shape[-1]
        return torch.stack([pil_to_tensor(o.resize((size, size), Image.BICUBIC)) for o in outs]).to(content_B3HW.device)


def make_method(spec: str) -> Method:
    if spec == "adain":
        return AdaINMethod("vgg_normalised")
    if spec == "adain-paper":
        return AdaINMethod("torchvision")
    if spec == "reinhard":
        return ReinhardMethod()
    if hub.is_hub_id(spec):  # pulled on first use; offline and not cached: one error, before any other work
        return PipelineMethod(hub.resolve_model(spec))
    path = Path(spec)
    if path.is_dir() and (path / "config.json").is_file():
        return PipelineMethod(path)
    raise ValueError(f"--method {spec!r} is neither one of {', '.join(BUILTIN_METHODS)} nor a model directory "
                     "(a folder with config.json, tokenizer.safetensors, transformer.safetensors) nor a hub id "
                     "(hf:OWNER/NAME[:variant])")


def _unique_names(methods: list[Method]) -> None:
    seen: dict[str, int] = {}
    for m in methods:
        seen[m.name] = seen.get(m.name, 0) + 1
        if seen[m.name] > 1:
            m.name = f"{m.name} ({seen[m.name]})"


# ------------------------------------------------------------------------------------------------ running


@dataclass
class RunResult:
    rows: list[dict] = field(default_factory=list)  # one per benchmark x method: means
    samples: list[dict] = field(default_factory=list)  # one per benchmark x method x sample
    files: list[Path] = field(default_factory=list)
    skipped_metrics: dict[str, str] = field(default_factory=dict)  # metric -> missing weight
    skipped_methods: dict[str, str] = field(default_factory=dict)  # method -> missing weight(s)
    rank: int = 0  # this process's under torchrun: only process 0 writes files


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, CUDA synchronised"
    return f"CPU, {torch.get_num_threads()} threads"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_weights(cfg: EvalConfig, methods: list[Method]) -> dict[str, weights.MissingWeightError]:
    needed_by: dict[str, list[str]] = {}
    for m in cfg.metrics:
        for w in weights_for(m, cfg.lpips_net):
            needed_by.setdefault(w, []).append(m)
    for method in methods:
        for w in method.weights:
            needed_by.setdefault(w, []).append(method.name)
    gone = weights.missing(needed_by)
    if gone and not cfg.allow_missing:
        raise MissingWeightsError(gone, needed_by)
    return gone


def timed(fn: Callable[[], T], device: torch.device) -> tuple[T, float]:
    """``fn()`` without autograd, and its seconds (CUDA synchronised before and after)."""
    _sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = fn()
    _sync(device)
    return out, time.perf_counter() - t0


@dataclass
class Scored:
    """One method over some samples, batch by batch: each sample's scores and seconds, in the order scored."""

    positions: list[int] = field(default_factory=list)  # the samples' places in their list
    scores: dict[str, list[torch.Tensor]] = field(default_factory=dict)  # metric -> per batch, (b,)
    seconds: list[float] = field(default_factory=list)  # per sample: its batch's seconds / the batch size
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)  # position -> output (CPU), those < keep

    def metric(self, name: str) -> torch.Tensor:
        """Every sample's value of one metric, (n,)."""
        return torch.cat(self.scores[name])

    def records(self) -> list[dict[str, float]]:
        """One {metric: value} per sample."""
        values = {k: self.metric(k).tolist() for k in self.scores}
        return [{k: v[j] for k, v in values.items()} for j in range(len(self.positions))]


def batch_slices(n: int, batch_size: int) -> list[slice]:
    """Positions 0 .. n-1 in batches of ``batch_size`` (the last one shorter)."""
    return [slice(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]


def score_batches(batches: Iterable[slice], generate: Callable[[slice], torch.Tensor],
                  score: Callable[[torch.Tensor, slice], dict[str, torch.Tensor]], device: torch.device,
                  keep: int = 0, on_batch: Callable[[], None] | None = None) -> Scored:
    """For each batch of sample positions: ``generate(sl)`` timed (`timed`), its images (B, 3, H, W) clamped
    to [0, 1] and scored by ``score(images, sl)`` ({metric: (B,)}); the outputs at positions < ``keep`` kept."""
    result = Scored()
    for sl in batches:
        gen, dt = timed(lambda: generate(sl), device)
        gen = gen.float().clamp(0, 1)
        for k, v in score(gen, sl).items():
            result.scores.setdefault(k, []).append(v.detach().float().cpu())
        positions = list(range(sl.start, sl.start + gen.shape[0]))
        result.positions += positions
        result.seconds += [dt / gen.shape[0]] * gen.shape[0]
        result.outputs.update({p: gen[j].cpu() for j, p in enumerate(positions) if p < keep})
        if on_batch is not None:
            on_batch()
    return result


@dataclass(frozen=True)
class Shard:
    """This process's part of a sharded run (`torchrun`: WORLD_SIZE > 1): every ``world``-th batch from
    ``rank`` on, so each sample is computed in the same batch as in a single process."""

    rank: int = 0
    world: int = 1
    owned: bool = False  # the process group was started here (`close` ends it)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def batches(self, n: int, batch_size: int) -> list[slice]:
        return batch_slices(n, batch_size)[self.rank::self.world]

    def gather(self, items: list) -> list:
        """Every process's ``items``, concatenated in rank order (this process's alone when not sharded)."""
        if self.world == 1:
            return items
        import torch.distributed as dist

        parts: list = [None] * self.world
        dist.all_gather_object(parts, items)
        return [x for part in parts for x in part]

    def close(self) -> None:
        if self.owned:
            import torch.distributed as dist

            dist.destroy_process_group()


def start_shard(device: torch.device) -> tuple[Shard, torch.device]:
    """Under torchrun (WORLD_SIZE > 1): join the process group (env://; nccl on CUDA, gloo on the CPU) and
    take the local GPU when the device names none; else a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Shard(), device
    import torch.distributed as dist

    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://")
    return Shard(dist.get_rank(), dist.get_world_size(), owned), device


def run(cfg: EvalConfig) -> RunResult:
    """Evaluate every method on every benchmark and write the outputs to `cfg.out`.

    Under torchrun the batches are shared out among the processes (`Shard`) and process 0 merges the
    per-sample records and writes the files; every process returns the merged result."""
    from tqdm.auto import tqdm

    # every check before any model or metric loads (and before hours of work end at an unwritable --out)
    output_folder(cfg.out, "--out folder")
    shard, device = start_shard(resolve_device(cfg.device))
    methods = [make_method(spec) for spec in cfg.methods]
    _unique_names(methods)
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
    grids: dict[str, dict[str, list[torch.Tensor]]] = {}
    for bench in benchmarks:
        size = cfg.image_size
        content = torch.stack([load_tensor(s.content, size) for s in bench.samples])
        style = torch.stack([load_tensor(s.style, size) for s in bench.samples])
        target = torch.stack([load_tensor(s.target, size) for s in bench.samples]) if bench.paired else None
        rows = min(cfg.grid_rows, len(bench.samples))
        grid = {"content": list(content[:rows]), "style": list(style[:rows])}
        if target is not None:
            grid["target"] = list(target[:rows])
        seeds_all = [cfg.seed + s.index for s in bench.samples]

        def score(gen: torch.Tensor, sl: slice) -> dict[str, torch.Tensor]:
            return suite(gen, content[sl].to(device), style[sl].to(device),
                         target[sl].to(device) if target is not None else None)

        for method in runnable:
            bar.set_description(f"{bench.name} / {method.name}")
            if cfg.warmup:
                with torch.no_grad():
                    method(content[:1].to(device), style[:1].to(device), seeds_all[:1])  # untimed
            scored = score_batches(
                shard.batches(len(bench.samples), cfg.batch_size),
                lambda sl: method(content[sl].to(device), style[sl].to(device), seeds_all[sl]),  # noqa: B023
                score, device, keep=rows, on_batch=lambda: bar.update(1))
            records = shard.gather(list(zip(scored.positions, scored.records(), scored.seconds)))
            outputs = dict(shard.gather(list(scored.outputs.items())))
            grid[method.name] = [outputs[p] for p in range(rows)]
            for pos, scores, seconds in sorted(records, key=lambda r: r[0]):
                sample = bench.samples[pos]
                rec = {"benchmark": bench.name, "method": method.name, "id": sample.id, "index": sample.index,
                       "content": str(sample.content), "style": str(sample.style),
                       "target": str(sample.target) if sample.target else None, "seed": seeds_all[pos],
                       **{k: scores[k] for k in suite.metrics}, **dict.fromkeys(result.skipped_metrics, MISSING),
                       TIME: seconds}
                result.samples.append(rec)
            mine = result.samples[-len(bench.samples):]
            row = {"benchmark": bench.name, "method": method.name, "paired": bench.paired, "n": len(bench.samples)}
            for k in cfg.metrics:
                row[k] = sum(r[k] for r in mine) / len(mine) if k in suite.metrics else MISSING
            row[TIME] = sum(r[TIME] for r in mine) / len(mine)
            result.rows.append(row)
        grids[bench.name] = grid
    bar.close()
    result.rank = shard.rank
    if shard.main:
        result.files += write_outputs(cfg, benchmarks, methods, runnable, result, grids, device_name(device))
    shard.close()
    return result


def write_outputs(cfg: EvalConfig, benchmarks: list[Benchmark], methods: list[Method], runnable: list[Method],
                  result: RunResult, grids: dict[str, dict[str, list[torch.Tensor]]], device: str) -> list[Path]:
    """The tables, the sample grids and the charts in `cfg.out`."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    files = write_tables(cfg, benchmarks, methods, result, out, device)
    for bench in benchmarks:
        path = out / f"samples_{_slug(bench.name)}.png"
        draw_grid(grids[bench.name], [m.name for m in runnable], bench.paired).save(path)
        files.append(path)
    for k in (*cfg.metrics, TIME):
        if k in result.skipped_metrics:
            continue
        files.append(save_bar_chart(out / f"chart_{k}.png", k, result.rows, [b.name for b in benchmarks],
                                    [m.name for m in runnable]))
    return files


# ------------------------------------------------------------------------------------------------ outputs


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "benchmark"


def _label(k: str) -> str:
    return "Time (s)" if k == TIME else METRICS[k].label


def _higher_better(k: str) -> bool:
    return False if k == TIME else METRICS[k].higher_is_better


def _fmt(v) -> str:
    return v if isinstance(v, str) else f"{v:.4g}"


def write_tables(cfg: EvalConfig, benchmarks: list[Benchmark], methods: list[Method], result: RunResult,
                 out: Path, device_name: str) -> list[Path]:
    columns = [*cfg.metrics, TIME]
    csv_path = out / "results.csv"
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["benchmark", "method", "paired", "n", *columns, "note"])
        for r in result.rows:
            w.writerow([r["benchmark"], r["method"], r["paired"], r["n"],
                        *[r[k] if isinstance(r[k], str) else f"{r[k]:.6g}" for k in columns], ""])
        for name, absent in result.skipped_methods.items():
            for b in benchmarks:
                w.writerow([b.name, name, b.paired, 0, *[MISSING] * len(columns), f"not run: missing weights {absent}"])
    jsonl_path = out / "per_sample.jsonl"
    with open(jsonl_path, "w", encoding="utf-8") as f:
        for rec in result.samples:
            f.write(json.dumps(rec) + "\n")

    md = ["# Evaluation", "",
          "| Benchmark | Method | " + " | ".join(f"{_label(k)} {'↑' if _higher_better(k) else '↓'}" for k in columns) + " |",
          "|---|---|" + "---:|" * len(columns)]
    for bench in benchmarks:
        rows = [r for r in result.rows if r["benchmark"] == bench.name]
        best = {}
        for k in columns:
            vals = [r[k] for r in rows if not isinstance(r[k], str)]
            if vals:
                best[k] = max(vals) if _higher_better(k) else min(vals)
        kind = "paired" if bench.paired else "unpaired"
        for r in rows:
            cells = []
            for k in columns:
                v = r[k]
                cell = _fmt(v)
                if not isinstance(v, str) and len(rows) > 1 and v == best.get(k):
                    cell = f"**{cell}**"
                cells.append(cell)
            md.append(f"| {bench.name} ({kind}, n={r['n']}) | {r['method']} | " + " | ".join(cells) + " |")
        for name, absent in result.skipped_methods.items():
            md.append(f"| {bench.name} ({kind}) | {name} | " + " | ".join(["not run"] * len(columns)) + " |")
    md += ["", "Notes:"]
    md.append(f"- Rows drawn per benchmark: up to {cfg.n} from split `{cfg.split}` with seed {cfg.seed}; "
              f"images resized to {cfg.image_size}x{cfg.image_size}" +
              (" (the paper's setting)." if cfg.image_size == 256 else " (the paper uses 256: these numbers are not comparable)."))
    md.append("- Paired benchmarks: LPIPS, SSIM, DreamSim and CLIP compare the result to the target; unpaired: to "
              "the content. Style loss is against the style image, content loss against the content image.")
    md.append(f"- LPIPS backbone: {cfg.lpips_net}. SSIM is the paper's zero-padded SSIM"
              + ("; SSIM (valid) is torchmetrics' valid-region SSIM." if "ssim_standard" in cfg.metrics else "."))
    md.append("- Time: seconds per image of the method's own inference (batch size "
              f"{cfg.batch_size}{', after one untimed warm-up call' if cfg.warmup else ', no warm-up'}, "
              f"on {device_name}), not of the metrics.")
    for bench in benchmarks:
        md.append(f"- {bench.name}: `{bench.manifest}` ({bench.total} rows in split `{cfg.split}`).")
    seen = set()
    for m in methods:
        if m.name not in seen:
            seen.add(m.name)
            md.append(f"- {m.name}: {m.description}.")
    for k, w in result.skipped_metrics.items():
        md.append(f"- {_label(k)}: `{MISSING}`, weight `{w}` not present (`stylevar weights fetch {w}`).")
    for name, absent in result.skipped_methods.items():
        md.append(f"- {name}: not run, missing weights {absent}.")
    md_path = out / "results.md"
    md_path.write_text("\n".join(md) + "\n", encoding="utf-8")
    return [csv_path, md_path, jsonl_path]


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
    ax.set_title(f"{_label(metric)} ({'higher' if _higher_better(metric) else 'lower'} is better)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------ CLI


def _parse_benchmark(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=MANIFEST_OR_ROOT, got {text!r}")
    return name, path


def _cmd(args: argparse.Namespace) -> int:
    metrics = tuple(NAMES) if args.metrics == ["all"] else tuple(args.metrics)
    cfg = EvalConfig(
        methods=tuple(args.method), benchmarks=tuple(args.benchmark), out=args.out, n=args.n, seed=args.seed,
        metrics=metrics, split=args.split, device=args.device, allow_missing=args.allow_missing,
        batch_size=args.batch_size, lpips_net=args.lpips_net, image_size=args.image_size,
        grid_rows=args.grid_rows, warmup=not args.no_warmup, progress=not args.quiet,
    )
    try:
        result = run(cfg)
    except MissingWeightsError as e:
        print(f"stylevar evaluate: {e}", file=sys.stderr)
        return EXIT_MISSING_WEIGHTS
    if result.rank != 0:  # under torchrun process 0 reports
        return 0
    for k, w in result.skipped_metrics.items():
        print(f"note: {k} marked {MISSING} (weight {w} not present)", file=sys.stderr)
    for name, absent in result.skipped_methods.items():
        print(f"note: method {name} not run (missing weights {absent})", file=sys.stderr)
    print((Path(cfg.out) / "results.md").read_text(encoding="utf-8"))
    print("wrote " + ", ".join(str(p) for p in result.files), file=sys.stderr)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `stylevar evaluate` (listed in stylevar.cli)."""
    p.description = __doc__.split("\n\n")[0]
    p.add_argument("--method", action="append", required=True, metavar="MODEL_DIR|hf:OWNER/NAME|adain|adain-paper|reinhard",
                   help="a method to evaluate (repeat for several); a hub id is pulled on first use")
    p.add_argument("--benchmark", action="append", required=True, type=_parse_benchmark,
                   metavar="NAME=MANIFEST_OR_ROOT", help="a triplet manifest, or a folder holding manifest.jsonl (repeat)")
    p.add_argument("--n", "--rows", type=int, default=50,
                   help="rows drawn per benchmark (default 50; under torchrun write --rows: it reads --n as its own)")
    p.add_argument("--seed", type=int, default=42, help="row drawing and generation seeds (default 42)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--metrics", nargs="+", default=list(PAPER_METRICS), metavar="METRIC",
                   help=f"'all' or any of {', '.join(NAMES)} (default: the paper's six)")
    p.add_argument("--split", choices=SPLITS, default="val", help="manifest split to draw from (default val)")
    p.add_argument("--allow-missing", action="store_true",
                   help="skip (and mark) metrics and methods whose weights are not present")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--batch-size", type=int, default=4, help="triplets per model call")
    p.add_argument("--lpips-net", choices=("vgg", "alex"), default="vgg", help="LPIPS backbone")
    p.add_argument("--image-size", type=int, default=256, help="evaluation resolution (the paper: 256)")
    p.add_argument("--grid-rows", type=int, default=4, help="samples shown in each samples_<benchmark>.png")
    p.add_argument("--no-warmup", action="store_true", help="time the first call too (default: one untimed call)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd)


def main(argv: list[str] | None = None) -> int:
    """`python -m stylevar.evaluate ARGS` is `stylevar evaluate ARGS`; sharded over N processes:
    ``torchrun --nproc-per-node N -m stylevar.evaluate ARGS``."""
    from stylevar.cli import main as cli_main

    return cli_main(["evaluate", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
