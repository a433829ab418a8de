"""`stylevar bench`: generation and teacher-forcing speed of a preset with random weights.

It reports ms per image and images/s per batch size, teacher-forcing tokens/s, peak CUDA memory and FLOPs per
image; `--naive` times the sampling loop against the naive blend. Progress goes to stderr, the result to stdout.
"""
from __future__ import annotations

import datetime as _dt
import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from stylevar.utils.atomic import atomic_write_text
from stylevar.utils.threads import apply_threads

TABLE_BEGIN, TABLE_END = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"


@dataclass
class BenchConfig:
    preset: str | tuple = "tiny"  # a preset's name, or its (VQVAEConfig, StyleVARConfig) pair
    device: str = "cpu"
    batch_sizes: tuple[int, ...] = (1, 8)
    repeats: int = 3
    warmup: int = 1
    naive: bool = False
    compile: bool = False
    compile_backend: str = "inductor"  # stylevar.runtime.compile.BACKENDS
    bf16: bool = True  # on CUDA
    tf_batch: int = 4
    threads: int | str | None = None  # stylevar.utils.threads: a count, "torch", None (the policy)
    peak_tflops: float | None = None  # device bf16 peak, for the fraction of the compute limit
    seed: int = 0

    @property
    def preset_name(self) -> str:
        if isinstance(self.preset, str):
            return self.preset
        tr = self.preset[1]
        return f"custom (depth {tr.depth}, width {tr.embed_dim}, {len(tr.patch_nums)} scales)"


@dataclass
class BenchResult:
    preset: str
    device: str
    machine: str
    date: str
    compile: bool
    dtype: str
    generate: list[dict] = field(default_factory=list)  # per batch size
    teacher_forcing: dict = field(default_factory=dict)
    naive: dict | None = None
    graphs: dict | None = None  # compiled: graphs per stage, the backend and the recompile-limit hits


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); nothing elsewhere."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]  # median


def flops_of(fn) -> int:
    """The FLOPs of one call of ``fn`` (torch's FlopCounterMode: matrix products, convolutions, attention)."""
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def machine_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} x{torch.get_num_threads()} threads"


def _fmt_seconds(sec: float) -> str:
    return f"{sec:.1f} s" if sec < 90 else f"{sec / 60:.1f} min"


def estimate_seconds(cfg: BenchConfig, probe_s: float) -> float:
    """Rough time of the whole run from one batch-1 `generate` call (`probe_s`)."""
    calls = cfg.warmup + cfg.repeats
    gen = sum(b * (calls + (1 if i == 0 else 0)) for i, b in enumerate(cfg.batch_sizes)) * probe_s
    tf = 3 * cfg.tf_batch * calls * probe_s
    naive = 2 * 2 * calls * probe_s if cfg.naive else 0.0
    return gen + tf + naive


@dataclass
class _Bench:
    """What every stage of a run shares: the model, its device, its image side and one random stream."""

    cfg: BenchConfig
    model: torch.nn.Module
    device: torch.device
    side: int
    g: torch.Generator
    say: Callable[[str], None]

    def images(self, batch: int) -> torch.Tensor:
        """Random images in [-1, 1] (the next draws of the run's stream)."""
        return (torch.rand(batch, 3, self.side, self.side, generator=self.g) * 2 - 1).to(self.device)

    def timed(self, fn) -> float:
        return _timed(fn, self.device, self.cfg.repeats, self.cfg.warmup)


def run(cfg: BenchConfig, progress: Callable[[str], None] | None = None) -> BenchResult:
    """The benchmark; ``progress`` (e.g. a stderr printer) gets one line per stage and the estimate."""
    bench = _build(cfg, progress or (lambda line: None))
    use_bf16 = bench.model.autocast_dtype is not None
    res = BenchResult(cfg.preset_name, bench.device.type, machine_name(bench.device), _dt.date.today().isoformat(),
                      cfg.compile, "bf16" if use_bf16 else "fp32")
    graphs = _GraphStages(bench.model)
    _probe(bench)
    res.generate = _time_generate(bench)
    graphs.stage("generate")
    res.teacher_forcing = _time_teacher_forcing(bench)
    graphs.stage("teacher_forcing")
    if cfg.naive:
        res.naive = _time_naive(bench)
    res.graphs = graphs.result()
    return res


class _GraphStages:
    """The graphs each stage of a compiled run added, and the run's recompile-limit hits."""

    def __init__(self, model):
        from stylevar.runtime.compile import compiled, recompile_limit_hits
        self.count, self.stages, self.seen = compiled(model), {}, 0
        self.hits_before = recompile_limit_hits()

    def stage(self, name: str) -> None:
        if self.count is not None:
            self.stages[name], self.seen = self.count.graphs - self.seen, self.count.graphs

    def result(self) -> dict | None:
        from stylevar.runtime.compile import recompile_limit_hits
        if self.count is None:
            return None
        return {"backend": self.count.backend, **self.stages, "total": self.count.graphs,
                "recompile_limit_hits": recompile_limit_hits() - self.hits_before}


def _build(cfg: BenchConfig, say: Callable[[str], None]) -> _Bench:
    """The preset with random weights on the device (bf16 autocast on CUDA unless off, compiled when asked)."""
    from stylevar.utils.devices import resolve_device
    from stylevar.pipelines.pipeline import StylePipeline
    device = resolve_device(cfg.device)
    apply_threads(cfg.threads)  # None: the process's policy (stylevar.utils.threads), as a loaded model gets
    t_build = time.perf_counter()
    pipe = StylePipeline.random(cfg.preset, seed=cfg.seed).to(device)
    model = pipe.model
    n_params = sum(p.numel() for p in model.parameters())
    say(f"built preset {cfg.preset_name} with random weights ({n_params / 1e6:.1f} M parameters, "
        f"{pipe.image_size} px) on {device} in {_fmt_seconds(time.perf_counter() - t_build)}")
    model.autocast_dtype = torch.bfloat16 if device.type == "cuda" and cfg.bf16 else None
    if cfg.compile:
        from stylevar.runtime.compile import compile_blocks

        compile_blocks(model, cfg.compile_backend)
    return _Bench(cfg, model, device, pipe.image_size, torch.Generator().manual_seed(cfg.seed), say)


def _probe(bench: _Bench) -> None:
    """One batch-1 `generate` call (its own random image), and the estimate of the whole run from it."""
    cfg, side = bench.cfg, bench.side
    bench.say("probe: one generate call at batch 1" + (" (compiles first)" if cfg.compile else ""))
    probe_img = (torch.rand(1, 3, side, side, generator=torch.Generator().manual_seed(cfg.seed)) * 2 - 1)
    probe_img = probe_img.to(bench.device)
    t0 = time.perf_counter()
    bench.model.generate(probe_img, probe_img, seed=0)
    sync(bench.device)
    probe = time.perf_counter() - t0
    bench.say(f"probe took {_fmt_seconds(probe)}; the whole run will take about "
              f"{_fmt_seconds(estimate_seconds(cfg, probe))}")


def _time_generate(bench: _Bench) -> list[dict]:
    """One row per batch size: ms per image, images/s, TFLOP/s, peak CUDA memory, the fraction of the peak."""
    cfg = bench.cfg
    rows, flops_per_image = [], 0.0
    for B in cfg.batch_sizes:
        bench.say(f"generate at batch {B}: {cfg.warmup} warm-up + {cfg.repeats} timed calls")
        sec, peak, flops = _generate_at(bench, B, count_flops=B == cfg.batch_sizes[0])
        flops_per_image = flops_per_image if flops is None else flops / B
        row = {"batch": B, "ms_per_image": 1000 * sec / B, "images_per_s": B / sec}
        if peak is not None:
            row["peak_mem_gib"] = peak
        row["tflops_per_s"] = flops_per_image * B / sec / 1e12
        if cfg.peak_tflops:
            row["fraction_of_peak"] = row["tflops_per_s"] / cfg.peak_tflops
        rows.append(row)
        bench.say(f"generate at batch {B}: {row['ms_per_image']:.1f} ms/image")
    if rows:
        rows[0]["gflop_per_image"] = flops_per_image / 1e9
    return rows


def _generate_at(bench: _Bench, batch: int, count_flops: bool) -> tuple[float, float | None, int | None]:
    """`generate` on a batch of random images: (median seconds, peak GiB on CUDA, FLOPs when counted)."""
    content, style = bench.images(batch), bench.images(batch)
    device = bench.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sec = bench.timed(lambda: bench.model.generate(content, style, seed=0))
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    flops = flops_of(lambda: bench.model.generate(content, style, seed=0)) if count_flops else None
    return sec, peak, flops


def _time_teacher_forcing(bench: _Bench) -> dict:
    """Training tokens/s of a teacher-forcing step (forward + backward)."""
    cfg, model = bench.cfg, bench.model
    B = cfg.tf_batch
    content, style = bench.images(B), bench.images(B)
    idx = model.tokenizer.encode_indices(bench.images(B))
    target = torch.cat(idx, dim=1)
    model.train()

    def step():
        logits = model.teacher_forcing_logits(content, style, idx)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())
        loss.backward()
        model.zero_grad(set_to_none=True)

    bench.say(f"teacher forcing at batch {B}: {cfg.warmup} warm-up + {cfg.repeats} timed steps")
    sec = bench.timed(step)
    model.eval()
    bench.say(f"teacher forcing at batch {B}: {B * model.cfg.num_tokens / sec:.0f} tokens/s")
    return {"batch": B, "tokens_per_s": B * model.cfg.num_tokens / sec, "ms_per_step": 1000 * sec}


def _time_naive(bench: _Bench) -> dict:
    """The transformer loop alone against the naive blend at batch 1, one condition shared by both."""
    from stylevar.models.sampling import make_generators
    from stylevar.models.transformer.naive import naive_sample_tokens
    model, device = bench.model, bench.device
    content, style = bench.images(1), bench.images(1)
    alpha_K = model.blend_alphas()
    bench.say("sampling loop at batch 1: this path, then the naive blend")
    with torch.no_grad(), model.loop_autocast(device):  # sample_tokens' own, re-entered
        cond = model.condition(content, style)
        fast = bench.timed(lambda: model.sample_tokens(cond, make_generators(0, 1, device), alpha_K))
        naive = bench.timed(lambda: naive_sample_tokens(model, cond, make_generators(0, 1, device), alpha_K))
    return {"batch": 1, "naive_ms_per_image": 1000 * naive, "fast_ms_per_image": 1000 * fast, "speedup": naive / fast}


def format_result(res: BenchResult) -> str:
    lines = [f"stylevar bench: preset {res.preset} on {res.machine} ({res.device}, {res.dtype}"
             f"{', compiled' if res.compile else ''})"]
    for row in res.generate:
        extra = "".join([f", peak {row['peak_mem_gib']:.2f} GiB" if "peak_mem_gib" in row else "",
                         f", {100 * row['fraction_of_peak']:.2f}% of peak" if "fraction_of_peak" in row else ""])
        lines.append(f"  generate  batch {row['batch']:>3}: {row['ms_per_image']:9.2f} ms/image "
                     f"{row['images_per_s']:9.2f} images/s  {row['tflops_per_s']:.4f} TFLOP/s{extra}")
    if res.generate and "gflop_per_image" in res.generate[0]:
        lines.append(f"  measured {res.generate[0]['gflop_per_image']:.2f} GFLOP per generated image")
    tf = res.teacher_forcing
    lines.append(f"  teacher forcing batch {tf['batch']}: {tf['tokens_per_s']:.0f} tokens/s ({tf['ms_per_step']:.1f} ms/step)")
    if res.graphs:
        g = res.graphs
        stages = ", ".join(f"{g[k]} {k.replace('_', ' ')}" for k in ("generate", "teacher_forcing") if k in g)
        eager = " (part of the run was eager)" if g["recompile_limit_hits"] else ""
        lines.append(f"  compiled ({g['backend']}): {g['total']} graphs ({stages}); recompile limit hit "
                     f"{g['recompile_limit_hits']} times{eager}")
    if res.naive:
        n = res.naive
        lines.append(f"  transformer loop, batch 1: naive blend {n['naive_ms_per_image']:.2f} ms/image, this path "
                     f"{n['fast_ms_per_image']:.2f} ms/image -> {n['speedup']:.2f}x faster")
    return "\n".join(lines)


def table_rows(records: list[dict]) -> str:
    out = ["| date | machine | preset | device | dtype | compile | batch | ms/image | images/s | peak GiB | % of peak |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in records:
        for row in r["generate"]:
            peak = f"{row['peak_mem_gib']:.2f}" if "peak_mem_gib" in row else "-"
            frac = f"{100 * row['fraction_of_peak']:.2f}" if "fraction_of_peak" in row else "-"
            out.append(f"| {r['date']} | {r['machine']} | {r['preset']} | {r['device']} | {r['dtype']} | "
                       f"{'yes' if r['compile'] else 'no'} | {row['batch']} | {row['ms_per_image']:.2f} | "
                       f"{row['images_per_s']:.2f} | {peak} | {frac} |")
    out += ["", "| date | machine | preset | teacher-forcing tokens/s (batch) | naive blend ms/image | fast ms/image | speedup |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in records:
        n = r.get("naive") or {}
        out.append(f"| {r['date']} | {r['machine']} | {r['preset']} | {r['teacher_forcing']['tokens_per_s']:.0f} "
                   f"({r['teacher_forcing']['batch']}) | "
                   + (f"{n['naive_ms_per_image']:.2f} | {n['fast_ms_per_image']:.2f} | {n['speedup']:.2f}x |" if n
                      else "- | - | - |"))
    return "\n".join(out)


def write_table(records_path: Path, table_path: Path) -> None:
    """Regenerate the table between the bench-table markers of `table_path` from the records file."""
    records = [json.loads(line) for line in records_path.read_text().splitlines() if line.strip()]
    text = table_path.read_text() if table_path.exists() else f"# Benchmarks\n\n{TABLE_BEGIN}\n{TABLE_END}\n"
    if TABLE_BEGIN not in text:
        text += f"\n{TABLE_BEGIN}\n{TABLE_END}\n"
    head, rest = text.split(TABLE_BEGIN, 1)
    _, tail = rest.split(TABLE_END, 1)
    atomic_write_text(table_path, f"{head}{TABLE_BEGIN}\n{table_rows(records)}\n{TABLE_END}{tail}")


def append_record(res: BenchResult, records_path: Path) -> None:
    """Add ``res`` as one JSON line to the records file (the file is replaced whole, never left torn)."""
    old = records_path.read_text() if records_path.exists() else ""
    atomic_write_text(records_path, old + json.dumps(asdict(res)) + "\n")
