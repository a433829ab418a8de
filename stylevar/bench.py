"""`stylevar bench`: generation and teacher-forcing speed of a preset with random weights.

Figures: ms per image and images/s for `generate` at each batch size (tokenizer encode/decode and the
image encoders included), teacher-forcing training tokens/s (forward + backward), peak memory on CUDA,
measured FLOPs per image and, given the device's peak, the fraction of it reached. `--naive` also times
the transformer's sampling loop against the naive blend (stylevar.transformer.naive) at batch 1 with the
same weights; the condition (tokenizer encoding, image encoders) and the final decode are the same work
in both and are left out of that comparison.

While it runs, one progress line per stage goes to stderr (stdout, and so `--json`, is only the result),
and after one probe call an estimate of the whole run's time, so a long run (d16 with --naive on a CPU
takes minutes) says so before it starts.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

TABLE_BEGIN, TABLE_END = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"


@dataclass
class BenchConfig:
    preset: str = "tiny"
    device: str = "cpu"
    batch_sizes: tuple[int, ...] = (1, 8)
    repeats: int = 3
    warmup: int = 1
    naive: bool = False
    compile: bool = False
    bf16: bool = True  # on CUDA
    tf_batch: int = 4
    threads: int | None = None
    peak_tflops: float | None = None  # device bf16 peak, for the fraction of the compute limit
    seed: int = 0


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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]  # median


def _flops(fn) -> int:
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
    """Rough time of the whole run from one batch-1 `generate` call (`probe_s`): generate scales with the
    batch; a teacher-forcing step (forward + backward) counts as three generate passes per row; the naive
    comparison runs two sampling loops per repeat."""
    calls = cfg.warmup + cfg.repeats
    gen = sum(b * (calls + (1 if i == 0 else 0)) for i, b in enumerate(cfg.batch_sizes)) * probe_s
    tf = 3 * cfg.tf_batch * calls * probe_s
    naive = 2 * 2 * calls * probe_s if cfg.naive else 0.0
    return gen + tf + naive


def _stderr(line: str) -> None:
    print(f"bench: {line}", file=sys.stderr, flush=True)


def run(cfg: BenchConfig, progress: Callable[[str], None] | None = None) -> BenchResult:
    """The benchmark; ``progress`` (e.g. a stderr printer) gets one line per stage and the estimate."""
    from stylevar.devices import resolve_device
    from stylevar.pipeline import StylePipeline

    say = progress or (lambda line: None)
    device = resolve_device(cfg.device)  # a missing device is one clear error, before any model is built
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t_build = time.perf_counter()
    pipe = StylePipeline.random(cfg.preset, seed=cfg.seed).to(device)
    model = pipe.model
    n_params = sum(p.numel() for p in model.parameters())
    say(f"built preset {cfg.preset} with random weights ({n_params / 1e6:.1f} M parameters, "
        f"{pipe.image_size} px) on {device} in {_fmt_seconds(time.perf_counter() - t_build)}")
    use_bf16 = device.type == "cuda" and cfg.bf16
    model.autocast_dtype = torch.bfloat16 if use_bf16 else None
    if cfg.compile:
        from stylevar.transformer.fast import compile_model

        compile_model(model)
    S = pipe.image_size
    g = torch.Generator().manual_seed(cfg.seed)
    res = BenchResult(cfg.preset, device.type, machine_name(device), _dt.date.today().isoformat(), cfg.compile,
                      "bf16" if use_bf16 else "fp32")

    say("probe: one generate call at batch 1" + (" (compiles first)" if cfg.compile else ""))
    probe_img = (torch.rand(1, 3, S, S, generator=torch.Generator().manual_seed(cfg.seed)) * 2 - 1).to(device)
    t0 = time.perf_counter()
    model.generate(probe_img, probe_img, seed=0)
    _sync(device)
    probe = time.perf_counter() - t0
    say(f"probe took {_fmt_seconds(probe)}; the whole run will take about "
        f"{_fmt_seconds(estimate_seconds(cfg, probe))}")

    for B in cfg.batch_sizes:
        say(f"generate at batch {B}: {cfg.warmup} warm-up + {cfg.repeats} timed calls")
        content = (torch.rand(B, 3, S, S, generator=g) * 2 - 1).to(device)
        style = (torch.rand(B, 3, S, S, generator=g) * 2 - 1).to(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        sec = _timed(lambda: model.generate(content, style, seed=0), device, cfg.repeats, cfg.warmup)
        row = {"batch": B, "ms_per_image": 1000 * sec / B, "images_per_s": B / sec}
        if device.type == "cuda":
            row["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        if B == cfg.batch_sizes[0]:
            flops_per_image = _flops(lambda: model.generate(content, style, seed=0)) / B
        row["tflops_per_s"] = flops_per_image * B / sec / 1e12
        if cfg.peak_tflops:
            row["fraction_of_peak"] = row["tflops_per_s"] / cfg.peak_tflops
        res.generate.append(row)
        say(f"generate at batch {B}: {row['ms_per_image']:.1f} ms/image")
    if res.generate:
        res.generate[0]["gflop_per_image"] = flops_per_image / 1e9

    # teacher-forcing training step: forward + backward
    B = cfg.tf_batch
    content = (torch.rand(B, 3, S, S, generator=g) * 2 - 1).to(device)
    style = (torch.rand(B, 3, S, S, generator=g) * 2 - 1).to(device)
    idx = model.tokenizer.encode_indices((torch.rand(B, 3, S, S, generator=g) * 2 - 1).to(device))
    target = torch.cat(idx, dim=1)
    model.train()

    def step():
        logits = model.teacher_forcing_logits(content, style, idx)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())
        loss.backward()
        model.zero_grad(set_to_none=True)

    say(f"teacher forcing at batch {B}: {cfg.warmup} warm-up + {cfg.repeats} timed steps")
    sec = _timed(step, device, cfg.repeats, cfg.warmup)
    model.eval()
    res.teacher_forcing = {"batch": B, "tokens_per_s": B * model.cfg.num_tokens / sec, "ms_per_step": 1000 * sec}
    say(f"teacher forcing at batch {B}: {B * model.cfg.num_tokens / sec:.0f} tokens/s")

    if cfg.naive:
        # the transformer loop alone: condition (tokenizer + encoders) once, shared by both paths
        from stylevar.sampling import make_generators
        from stylevar.transformer.naive import naive_sample_tokens

        content = (torch.rand(1, 3, S, S, generator=g) * 2 - 1).to(device)
        style = (torch.rand(1, 3, S, S, generator=g) * 2 - 1).to(device)
        with torch.no_grad():
            cond = model.condition(content, style)
        alpha_K = model.blend_alphas()
        say("sampling loop at batch 1: this path, then the naive blend")
        fast = _timed(lambda: model.sample_tokens(cond, make_generators(0, 1, device), alpha_K), device,
                      cfg.repeats, cfg.warmup)
        naive = _timed(lambda: naive_sample_tokens(model, cond, make_generators(0, 1, device), alpha_K), device,
                       cfg.repeats, cfg.warmup)
        res.naive = {"batch": 1, "naive_ms_per_image": 1000 * naive, "fast_ms_per_image": 1000 * fast,
                     "speedup": naive / fast}
    return res


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
    table_path.write_text(f"{head}{TABLE_BEGIN}\n{table_rows(records)}\n{TABLE_END}{tail}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `stylevar bench` (listed in stylevar.cli)."""
    p.add_argument("--preset", default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-sizes", default="1,8", help="comma-separated batch sizes for generate")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--tf-batch", type=int, default=4, help="batch size of the teacher-forcing step")
    p.add_argument("--naive", action="store_true", help="also time the naive blend at batch 1")
    p.add_argument("--compile", action="store_true", help="torch.compile the per-scale transformer step")
    p.add_argument("--fp32", action="store_true", help="no bf16 autocast on CUDA")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--peak-tflops", type=float, default=None, help="device peak (bf16 dense) for the fraction")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--record", type=Path, help="append the result to this JSON-lines file")
    p.add_argument("--table", type=Path, help="regenerate the table in this markdown file from --record")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    cfg = BenchConfig(preset=args.preset, device=args.device,
                      batch_sizes=tuple(int(b) for b in args.batch_sizes.split(",")), repeats=args.repeats,
                      warmup=args.warmup, naive=args.naive, compile=args.compile, bf16=not args.fp32,
                      tf_batch=args.tf_batch, threads=args.threads, peak_tflops=args.peak_tflops)
    res = run(cfg, progress=_stderr)
    print(json.dumps(asdict(res), indent=1) if args.json else format_result(res))
    if args.record:
        with open(args.record, "a") as f:
            f.write(json.dumps(asdict(res)) + "\n")
        if args.table:
            write_table(args.record, args.table)
    return 0
