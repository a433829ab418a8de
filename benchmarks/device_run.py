"""The GPU run: what only a GPU can measure, as one bounded command. Run it on your GPU:

    python -m benchmarks.device_run OUTDIR [--device cuda] [--preset d20]          # at most 8 minutes
    python -m benchmarks.device_run OUTDIR --device cpu --preset tiny --batch-sizes 1,2 --requests 4 \\
        --serve-seconds 2 --compile-backend eager                                  # the CPU dry run (the tests')

Each stage of STAGES runs in its own child process with a share of `--budget-s` (past it, the stage and all it started
are killed, `timed_out`; a failing stage records its error and the run goes on), writing OUTDIR/<stage>.json and .log,
gathered in OUTDIR/device_run.json. Exit status 0 when every stage is `ok`."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.harness import PeakSampler, command_parser, proc_bytes
from stylevar.utils.atomic import atomic_write_text

# (stage, share of the budget), in order; the last one takes whatever is left:
#   environment        the GPU, driver, torch, CUDA, cuDNN, the bf16 peak (MFU), why CUDA is unusable
#   golden             the reference's golden tokens, logits and reconstruction (tests/data/reference) in strict fp32
#   generate_eager     `stylevar bench` of the preset (random weights) at each batch size: ms/image, memory, % of peak
#   sft_step           one bf16 SFT optimizer step (benchmarks.train_step): ms/step, samples/s, memory, MFU
#   service            `python -m serve` under `--requests` clients (benchmarks.load_test): latency, GPU memory
#   generate_compiled  as generate_eager with the blocks compiled: torch._dynamo's graphs and recompile-limit hits
STAGES: tuple[tuple[str, float], ...] = (("environment", 0.06), ("golden", 0.1), ("generate_eager", 0.17),
                                         ("sft_step", 0.13), ("service", 0.23), ("generate_compiled", 1.0))
REPO = Path(__file__).resolve().parents[1]  # the children run `-m benchmarks.device_run` from here
MIN_STAGE_S = 5.0  # a stage with less time than this left is skipped
SUMMARY_RESERVE_S = 2.0  # kept back for the summary

# dense bf16 peaks (TFLOP/s, NVIDIA's data sheets) by a pattern on the GPU's name; the first match wins
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    (r"\bH100\b.*\bPCIe\b", 756.0), (r"\bH100\b.*\bNVL\b", 835.0), (r"\bH200\b.*\bNVL\b", 835.0),
    (r"\bH100\b", 989.0), (r"\bH200\b", 989.0), (r"\bGH200\b", 989.0),  # SXM ("NVIDIA H100 80GB HBM3")
    (r"\bB200\b", 2250.0), (r"\bA100\b", 312.0), (r"\bA800\b", 312.0),
    (r"\bL40S\b", 362.0), (r"\bL40\b", 181.0), (r"\bL4\b", 121.0),
    (r"\bA10\b", 125.0), (r"\bA6000\b", 155.0),  # RTX A6000
)


def peak_tflops(name: str) -> float | None:
    """The dense bf16 peak of the GPU called ``name`` (e.g. "NVIDIA H100 80GB HBM3"), None when unknown."""
    for pattern, tflops in PEAK_BF16_TFLOPS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return tflops
    return None


@dataclass(frozen=True)
class DeviceRunConfig:
    out: Path
    device: str = "cuda"
    preset: str = "d20"
    batch_sizes: tuple[int, ...] = (1, 16, 64)
    compile_backend: str = "inductor"  # "eager": dynamo's graphs without code generation (the CPU dry run)
    repeats: int = 3
    warmup: int = 1
    train_batch: int = 16
    train_variant: str = "eager"  # benchmarks.train_step's variant: eager, or default (blocks compiled)
    requests: int = 64  # concurrent clients of the service
    serve_seconds: float = 20.0  # how long they send back to back
    budget_s: float = 480.0  # the whole run


DEFAULTS = DeviceRunConfig(out=Path())  # the options' defaults (OUTDIR is the command's argument)


def parse_args(argv: list[str] | None):
    p = command_parser("benchmarks.device_run", __doc__)
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
    given = {f.name: getattr(a, f.name) for f in dataclasses.fields(DeviceRunConfig)}
    return DeviceRunConfig(**{**given, "out": a.out.resolve(), "batch_sizes": batches})


def say(line: str) -> None:
    print(f"device_run: {line}", file=sys.stderr, flush=True)


def device_peak_tflops(device: str) -> float | None:
    """The dense bf16 peak of ``device`` (`peak_tflops`); None for the CPU or an unknown GPU."""
    import torch
    return peak_tflops(torch.cuda.get_device_name(torch.device(device))) if device.startswith("cuda") else None


def nvidia_smi(*query: str) -> list[str]:
    """nvidia-smi's CSV lines for ``query`` (no header, no units); [] where there is no nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return []
    run = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         timeout=30)
    return [line.strip() for line in run.stdout.splitlines() if line.strip()] if run.returncode == 0 else []


def environment(cfg: DeviceRunConfig) -> dict:
    """The machine: GPU, driver, torch and its CUDA, and why CUDA is unusable when a GPU is present but unused."""
    import torch
    from stylevar.utils.devices import cuda_unusable_reason, driver_version
    out = {"python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
           "torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
           "device": cfg.device, "cuda_unusable": cuda_unusable_reason()}
    if cfg.device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(cfg.device))
        index = torch.device(cfg.device).index or 0
        smi = nvidia_smi("--query-gpu=name,driver_version,memory.total", "-i", str(index))
        out.update(gpu=props.name, gpu_count=torch.cuda.device_count(), capability=f"{props.major}.{props.minor}",
                   gpu_memory_gib=round(props.total_memory / 2 ** 30, 2), nvidia_smi=smi,
                   driver=smi[0].split(", ")[1] if smi else driver_version(), bf16=torch.cuda.is_bf16_supported(),
                   peak_bf16_tflops=peak_tflops(props.name))
    return out


def _golden_models():
    """The reference's small configuration with its seeded weights (tests/reference.py) and golden outputs."""
    import torch
    from stylevar.config import StyleVARConfig, VQVAEConfig
    from stylevar.loaders.convert import load_stylevar, load_vqvae
    from tests import reference
    root = reference.reference_dir()
    folder, ref_cfg = root / "golden_small", reference.read_config(root)

    def state(table: str, offset: int) -> dict[str, torch.Tensor]:
        return reference.seeded_state(reference.read_key_table(folder / table), ref_cfg["patch_nums"],
                                      ref_cfg["seed"] + offset)

    vq = load_vqvae(state("vae_keys.tsv", 0), VQVAEConfig.from_reference(ref_cfg))
    model = load_stylevar(state("stylevar_keys.tsv", 1000), StyleVARConfig.from_reference(ref_cfg), vq)
    return vq, model, torch.load(folder / "golden.pt", weights_only=True)


def golden(cfg: DeviceRunConfig) -> dict:
    """The reference's golden tokens, logits and reconstruction recomputed on the device in strict fp32."""
    import torch
    device = torch.device(cfg.device)  # strict fp32: the stage's process set no TF32 (benchmarks.device_run)
    vq, model, data = _golden_models()
    vq, model = vq.to(device).eval(), model.to(device).eval()
    out: dict = {"tf32": False, "tokens": {}}
    with torch.no_grad():
        for name in ("content", "style", "target"):
            idx = vq.encode_indices(data[name].to(device))
            differ = [int((a.cpu() != b).sum()) for a, b in zip(idx, data[f"{name}_idx"])]
            out["tokens"][name] = {"differ_per_scale": differ, "total": sum(b.numel() for b in data[f"{name}_idx"])}
        target = [t.to(device) for t in data["target_idx"]]
        logits = model.teacher_forcing_logits(data["content"].to(device), data["style"].to(device), target)
        recon = vq.decode_indices(target)
    out["logits_max_abs_diff"] = float((logits.float().cpu() - data["logits"]).abs().max())
    out["recon_max_abs_diff"] = float((recon.float().cpu() - data["recon"]).abs().max())
    out["tokens_equal"] = all(sum(t["differ_per_scale"]) == 0 for t in out["tokens"].values())
    out["within_1e-4"] = out["logits_max_abs_diff"] <= 1e-4 and out["recon_max_abs_diff"] <= 1e-4
    return out


def dynamo_counters() -> dict:
    """torch._dynamo's counters as plain dicts: graphs made, frames, graph breaks, recompile-limit hits."""
    from torch._dynamo.utils import counters
    from stylevar.runtime.compile import recompile_limit_hits
    raw = {group: {str(k): v for k, v in c.items()} for group, c in counters.items() if c}
    return {"graphs": raw.get("stats", {}).get("unique_graphs", 0), "recompile_limit_hits": recompile_limit_hits(),
            "graph_breaks": sum(raw.get("graph_break", {}).values()), "counters": raw}


def generation(cfg: DeviceRunConfig, compiled: bool) -> dict:
    """`stylevar bench` at each batch size; compiled, also torch._dynamo's graphs and recompile-limit hits."""
    from torch._dynamo.utils import counters
    from stylevar.runtime.bench import BenchConfig, run
    bench = BenchConfig(preset=cfg.preset, device=cfg.device, batch_sizes=cfg.batch_sizes, repeats=cfg.repeats,
                        warmup=cfg.warmup, compile=compiled, compile_backend=cfg.compile_backend, tf_batch=1,
                        peak_tflops=device_peak_tflops(cfg.device))
    counters.clear()
    result = run(bench, progress=say)
    return {**dataclasses.asdict(result), "compile_backend": cfg.compile_backend if compiled else None,
            "dynamo": dynamo_counters()}


def sft_step(cfg: DeviceRunConfig) -> dict:
    """One SFT optimizer step in bf16 autocast (benchmarks.train_step's measurement, this project's step alone)."""
    from benchmarks.train_step import StepBenchConfig, measure
    step = StepBenchConfig(batch_sizes=(cfg.train_batch,), precisions=("bf16",), repeats=cfg.repeats,
                           warmup=cfg.warmup, threads=os.cpu_count() or 1, reference=False, preset=cfg.preset,
                           device=cfg.device, peak_tflops=device_peak_tflops(cfg.device) or 0.0,
                           variants=(cfg.train_variant,))
    return measure(step)


def process_memory(pid: int) -> dict:
    """A process's GPU memory (nvidia-smi, MiB; None without one) and its peak resident host memory (MiB)."""
    gpu = None
    for line in nvidia_smi("--query-compute-apps=pid,used_memory"):
        app_pid, used = (x.strip() for x in line.split(",")[:2])
        if app_pid == str(pid):
            gpu = (gpu or 0) + int(used)
    host = None
    with contextlib.suppress(OSError, RuntimeError):
        host = proc_bytes(pid, "VmHWM") / 2 ** 20
    return {"gpu_mib": gpu, "host_peak_rss_mib": host}


def service(cfg: DeviceRunConfig, time_left: Callable[[], float]) -> dict:
    """`python -m serve` on a random model under `cfg.requests` clients (benchmarks.load_test)."""
    from benchmarks.load_test import LoadConfig, demo_image, run_load
    from serve.testing import ServerProcess
    from stylevar.pipelines.pipeline import StylePipeline
    model_dir = Path(tempfile.mkdtemp(prefix="device-run-model-"))  # not under OUTDIR: d20 is gigabytes
    try:
        StylePipeline.random(cfg.preset, name=f"{cfg.preset}-random").save_pretrained(model_dir)
        settings = {"STYLEVAR_DEVICE": cfg.device, "STYLEVAR_THREADS": str(max(1, (os.cpu_count() or 2) // 2))}
        with ServerProcess.serve(model_dir, settings=settings, extra_args=("--no-ui", "--device", cfg.device),
                                 log_dir=cfg.out) as srv:
            srv.wait_ready(timeout=max(1.0, time_left() - cfg.serve_seconds - 10))
            ready = process_memory(srv.proc.pid)
            load = LoadConfig(url=srv.url, concurrency=cfg.requests, seconds=cfg.serve_seconds,
                              content=demo_image(256, 192, 0), style=demo_image(128, 128, 1))
            with PeakSampler(lambda: process_memory(srv.proc.pid)["gpu_mib"], every_s=0.5) as watch:
                summary = asyncio.run(run_load(load)).summary()
            after = process_memory(srv.proc.pid)
        return {"clients": cfg.requests, "load": summary, "memory_ready": ready, "memory_after": after,
                "peak_gpu_mib_under_load": watch.peak, "log": str(srv.log_path)}
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)


def run_one_stage(name: str, cfg, limit_s: float) -> dict:
    """The figures of stage ``name`` (this process is its child)."""
    from stylevar.utils.precision import set_matmul_precision
    start = time.monotonic()
    set_matmul_precision(tf32=name != "golden")  # the policy's TF32; the golden tokens compare in strict fp32
    if name == "environment":
        return environment(cfg)
    if name == "golden":
        return golden(cfg)
    if name in ("generate_eager", "generate_compiled"):
        return generation(cfg, compiled=name == "generate_compiled")
    if name == "sft_step":
        return sft_step(cfg)
    return service(cfg, lambda: limit_s - (time.monotonic() - start))


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


def run_bounded(argv: list[str], limit_s: float, log: Path) -> str:
    """Run ``argv`` in its own session for at most ``limit_s`` seconds: "exited" or "timed_out"."""
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
    return (f"{gpu}; torch {env['torch']}, CUDA {env['torch_cuda']}, cuDNN {env['cudnn']}; "
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
        say(f"{name} (at most {limit:.0f} s) ...")
        records[name] = run_stage(name, child_argv, cfg.out, limit)
        say(f"{name}: {records[name]['status']} in {records[name].get('seconds', 0):.1f} s")
        if name == "environment" and records[name]["status"] == "ok":
            say(environment_line(records[name]["figures"]))
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
