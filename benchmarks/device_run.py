"""The prepared device run: what only a GPU can measure, as one bounded command (issue 60).

    python -m benchmarks.device_run OUTDIR [--device cuda] [--preset d20]          # at most 8 minutes
    python -m benchmarks.device_run OUTDIR --device cpu --preset tiny --batch-sizes 1,2 --requests 4 \\
        --serve-seconds 2 --compile-backend eager                                  # the CPU dry run (the tests')

Stages, in this order, each in a child process of its own (`--stage`) with a time limit, a share of the whole
run's budget (`--budget-s`, 480 s): a stage past its limit is killed with everything it started, recorded as
`timed_out`, and the run goes on; a stage that fails records its error and the run goes on.

- `environment`: the GPU (name, count, capability, memory), the driver, torch and its CUDA and cuDNN, the dense
  bf16 peak the MFU is taken against (benchmarks/gpu_peaks.py), and, when a GPU is present but unusable, why.
- `golden`: the reference's golden tokens, logits and reconstruction (tests/data/reference, computed on the CPU)
  recomputed on the device with TF32 off: tokens that differ per scale, the largest logit and pixel differences.
- `generate_eager`: `stylevar bench` (random weights of the preset) at each batch size: ms/image, images/s, peak
  memory (torch.cuda.max_memory_allocated), % of the peak; torch._dynamo's counters (no graphs when eager).
- `sft_step`: one SFT optimizer step of the preset in bf16 autocast (benchmarks.train_step): ms/step, samples/s,
  the memory a step needs, MFU.
- `service`: `python -m serve --device DEVICE` on a random model of the preset, `--requests` clients sending
  `POST /stylize` back to back for `--serve-seconds` (benchmarks.load_test): statuses, p50/p95/p99, the service's
  GPU memory (nvidia-smi: when ready, the peak under load) and its peak host memory.
- `generate_compiled`: as `generate_eager` with the blocks compiled, and the graphs torch._dynamo made and its
  recompile-limit hits (last: compiling may take whatever the budget has left).

Every stage writes OUTDIR/<stage>.json (`status`, `seconds`, `limit_s`, its `figures` or `error`) and its log
OUTDIR/<stage>.log; OUTDIR/device_run.json gathers them all. Exit status 0 when every stage is `ok`, else 1.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

from benchmarks.device_config import DeviceRunConfig
from stylevar.utils.atomic import atomic_write_text
from stylevar.utils.helptext import RawDescriptionHelpFormatter

# (stage, share of the budget): the last one takes whatever is left
STAGES: tuple[tuple[str, float], ...] = (("environment", 0.06), ("golden", 0.1), ("generate_eager", 0.17),
                                         ("sft_step", 0.13), ("service", 0.23), ("generate_compiled", 1.0))
REPO = Path(__file__).resolve().parents[1]  # the children run `-m benchmarks.device_run` from here
MIN_STAGE_S = 5.0  # a stage with less time than this left is skipped
SUMMARY_RESERVE_S = 2.0  # kept back for the summary


DEFAULTS = DeviceRunConfig(out=Path())  # the options' defaults (OUTDIR is the command's argument)


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.device_run", description=__doc__,
                                formatter_class=RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="folder the figures are written to (created)")
    d = DEFAULTS
    p.add_argument("--device", default=d.device, help="cuda, cuda:N or cpu (the dry run)")
    p.add_argument("--preset", default=d.preset, help="stylevar preset (random weights): d20, or tiny for a dry run")
    p.add_argument("--batch-sizes", default=",".join(map(str, d.batch_sizes)),
                   help="generation batch sizes, comma-separated")
    p.add_argument("--compile-backend", default=d.compile_backend, help="torch.compile backend of the compiled "
                   "stage; eager: dynamo's graphs only (the CPU dry run)")
    p.add_argument("--repeats", type=int, default=d.repeats, help="timed calls per figure (median)")
    p.add_argument("--warmup", type=int, default=d.warmup, help="untimed calls before them")
    p.add_argument("--train-batch", type=int, default=d.train_batch, help="batch of the SFT step")
    p.add_argument("--train-variant", default=d.train_variant, help="benchmarks.train_step variant: eager or "
                   "default (blocks compiled: minutes of compiling for d20)")
    p.add_argument("--requests", type=int, default=d.requests, help="concurrent clients of the service")
    p.add_argument("--serve-seconds", type=float, default=d.serve_seconds, help="how long the clients send")
    p.add_argument("--budget-s", type=float, default=d.budget_s, help="the whole run's wall-clock budget")
    p.add_argument("--stages", default=",".join(name for name, _ in STAGES), help="the stages to run")
    p.add_argument("--stage", help=argparse.SUPPRESS)  # a child: run this one stage
    p.add_argument("--stage-limit-s", type=float, default=0.0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    try:
        batches = tuple(int(b) for b in a.batch_sizes.split(",") if b)
    except ValueError:
        p.error(f"--batch-sizes takes integers, got {a.batch_sizes!r}")
    stages = tuple(s for s in a.stages.split(",") if s)
    known = [name for name, _ in STAGES]
    if not batches or min(batches) < 1 or a.repeats < 1 or a.warmup < 0 or a.train_batch < 1 or a.requests < 1:
        p.error("--batch-sizes, --repeats, --train-batch and --requests must be >= 1, --warmup >= 0")
    if a.budget_s <= MIN_STAGE_S + SUMMARY_RESERVE_S or a.serve_seconds <= 0:
        p.error(f"--budget-s must be over {MIN_STAGE_S + SUMMARY_RESERVE_S:g} and --serve-seconds over 0")
    if not stages or any(s not in known for s in stages):
        p.error(f"--stages: each one of {', '.join(known)}")
    return a, batches, stages


def config_of(a, batches: tuple[int, ...]) -> DeviceRunConfig:
    return DeviceRunConfig(out=a.out.resolve(), device=a.device, preset=a.preset, batch_sizes=batches,
                           compile_backend=a.compile_backend, repeats=a.repeats, warmup=a.warmup,
                           train_batch=a.train_batch, train_variant=a.train_variant, requests=a.requests,
                           serve_seconds=a.serve_seconds, budget_s=a.budget_s)


# ------------------------------------------------------------------------------------------ a child: one stage
def run_one_stage(name: str, cfg, limit_s: float) -> dict:
    """The figures of stage ``name`` (this process is its child)."""
    from benchmarks.measures import device_run as stages
    from stylevar.utils.precision import set_matmul_precision

    start = time.monotonic()
    set_matmul_precision(tf32=name != "golden")  # the policy's TF32; the golden tokens compare in strict fp32
    if name == "environment":
        return stages.environment(cfg)
    if name == "golden":
        return stages.golden(cfg)
    if name in ("generate_eager", "generate_compiled"):
        return stages.generation(cfg, compiled=name == "generate_compiled")
    if name == "sft_step":
        return stages.sft_step(cfg)
    return stages.service(cfg, lambda: limit_s - (time.monotonic() - start))


def child(name: str, cfg, limit_s: float) -> int:
    """Run one stage and write OUTDIR/<stage>.json: its figures, or the error that ended it."""
    t0 = time.monotonic()
    try:
        record = {"status": "ok", "figures": run_one_stage(name, cfg, limit_s)}
    except Exception as e:  # any failure of a stage is a figure of the run, not the end of it
        traceback.print_exc()
        record = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
    record["seconds"] = round(time.monotonic() - t0, 2)
    atomic_write_text(cfg.out / f"{name}.json", json.dumps(record, indent=1, default=str))
    return 0 if record["status"] == "ok" else 1


# ------------------------------------------------------------------------------------------ the parent
def run_bounded(argv: list[str], limit_s: float, log: Path) -> str:
    """Run ``argv`` in a session of its own for at most ``limit_s`` seconds (then it and everything it started
    are killed): "exited" or "timed_out"."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
        try:
            proc.wait(timeout=limit_s)
            return "exited"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return "timed_out"


def stage_limit(share: float, budget_s: float, left_s: float) -> float:
    return min(share * budget_s, left_s - SUMMARY_RESERVE_S)


def run_stage(name: str, argv: list[str], out: Path, limit_s: float) -> dict:
    """One stage in a bounded child: its record (OUTDIR/<stage>.json), or why there is none."""
    path, log = out / f"{name}.json", out / f"{name}.log"
    path.unlink(missing_ok=True)
    t0 = time.monotonic()
    ended = run_bounded([*argv, "--stage", name, "--stage-limit-s", f"{limit_s:.1f}"], limit_s, log)
    if ended == "timed_out":
        record = {"status": "timed_out", "seconds": round(time.monotonic() - t0, 2)}
        atomic_write_text(path, json.dumps(record, indent=1))
    elif not path.exists():
        tail = log.read_text(errors="replace")[-2000:]
        record = {"status": "crashed", "seconds": round(time.monotonic() - t0, 2), "error": tail}
        atomic_write_text(path, json.dumps(record, indent=1))
    else:
        record = json.loads(path.read_text())
    return {**record, "limit_s": round(limit_s, 1)}


def environment_line(env: dict) -> str:
    """The machine in one line: GPU, driver, torch and its CUDA."""
    gpu = f"{env['gpu']} x{env['gpu_count']} ({env['gpu_memory_gib']} GiB), driver {env['driver']}" if "gpu" in env \
        else f"no GPU in use ({env.get('cuda_unusable') or 'device ' + env['device']})"
    return (f"device_run: {gpu}; torch {env['torch']}, CUDA {env['torch_cuda']}, cuDNN {env['cudnn']}; "
            f"Python {env['python']}")


def parent(cfg, stages: tuple[str, ...], child_argv: list[str]) -> int:
    """Every stage in order within the budget; OUTDIR/device_run.json with all of them."""
    start = time.monotonic()
    records: dict[str, dict] = {}
    for name, share in STAGES:
        if name not in stages:
            continue
        left = cfg.budget_s - (time.monotonic() - start)
        limit = stage_limit(share, cfg.budget_s, left)
        if limit < MIN_STAGE_S:
            records[name] = {"status": "skipped", "error": f"{left:.0f} s of the budget left"}
            continue
        print(f"device_run: {name} (at most {limit:.0f} s) ...", file=sys.stderr, flush=True)
        records[name] = run_stage(name, child_argv, cfg.out, limit)
        print(f"device_run: {name}: {records[name]['status']} in {records[name].get('seconds', 0):.1f} s",
              file=sys.stderr, flush=True)
        if name == "environment" and records[name]["status"] == "ok":
            print(environment_line(records[name]["figures"]), file=sys.stderr, flush=True)
    summary = {"config": {**asdict(cfg), "out": str(cfg.out)}, "seconds": round(time.monotonic() - start, 1),
               "stages": records}
    atomic_write_text(cfg.out / "device_run.json", json.dumps(summary, indent=1, default=str))
    print(json.dumps({name: r["status"] for name, r in records.items()}))
    return 0 if all(r["status"] == "ok" for r in records.values()) else 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    a, batches, stages = parse_args(args)
    cfg = config_of(a, batches)
    cfg.out.mkdir(parents=True, exist_ok=True)
    if a.stage:
        return child(a.stage, cfg, a.stage_limit_s)
    return parent(cfg, stages, [sys.executable, "-m", "benchmarks.device_run", *args])


if __name__ == "__main__":
    raise SystemExit(main())
