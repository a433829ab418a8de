"""`stylevar bench`: generation and teacher-forcing speed of a preset with random weights (stylevar.runtime.bench)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stylevar.cli.command import Command
from stylevar.cli.values import threads_argument
from stylevar.config import PRESETS
from stylevar.utils.threads import THREADS_HELP  # no torch

NAIVE_COST = "--preset d16 --naive peaks at about 10.5 GB of memory and takes about 16 min; tiny: 0.9 GB, 13 s"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", help=f"{', '.join(PRESETS)}: the model's shapes (its weights are random)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ...")
    p.add_argument("--batch-sizes", default="1,8", help="comma-separated batch sizes for generate")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per measurement (their median is reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls before the timed ones")
    p.add_argument("--tf-batch", type=int, default=4, help="batch size of the teacher-forcing step")
    p.add_argument("--naive", action="store_true",
                   help=f"also time the naive blend at batch 1 (on a 2-core CPU: {NAIVE_COST})")
    p.add_argument("--compile", action="store_true", help="torch.compile the per-scale transformer step")
    p.add_argument("--compile-backend", choices=("inductor", "eager"), default="inductor",
                   help="with --compile: inductor generates kernels; eager traces the graphs only (their count)")
    p.add_argument("--fp32", action="store_true", help="no bf16 autocast on CUDA")
    p.add_argument("--threads", type=threads_argument, default=None, metavar="N|auto|torch",
                   help=f"{THREADS_HELP}; default: auto")
    p.add_argument("--peak-tflops", type=float, default=None, help="device peak (bf16 dense) for the fraction")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--record", type=Path, help="append the result to this JSON-lines file")
    p.add_argument("--table", type=Path, help="regenerate the table in this markdown file from --record")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict
    from stylevar.runtime import bench
    from stylevar.loaders import preflight
    from stylevar.utils.atomic import WriteFailedError
    from stylevar.utils.precision import set_matmul_precision
    set_matmul_precision()

    cfg = bench.BenchConfig(preset=args.preset, device=args.device,
                            batch_sizes=tuple(int(b) for b in args.batch_sizes.split(",")), repeats=args.repeats,
                            warmup=args.warmup, naive=args.naive, compile=args.compile,
                            compile_backend=args.compile_backend, bf16=not args.fp32,
                            tf_batch=args.tf_batch, threads=args.threads, peak_tflops=args.peak_tflops)
    res = bench.run(cfg, progress=_stderr)
    print(json.dumps(asdict(res), indent=1) if args.json else bench.format_result(res))
    if args.record:
        try:
            for path in filter(None, (args.record, args.table)):  # their folders made, as every output's
                path.parent.mkdir(parents=True, exist_ok=True)
            bench.append_record(res, args.record)
            if args.table:
                bench.write_table(args.record, args.table)
        except WriteFailedError as e:
            raise preflight.InputError(str(e)) from e
        except OSError as e:
            raise preflight.InputError(f"--record / --table: cannot make the folder: {e}") from e
    return 0


def _stderr(line: str) -> None:
    print(f"bench: {line}", file=sys.stderr, flush=True)


COMMAND = Command("bench", "speed of generation and teacher forcing (random weights)", add_arguments)
