"""The stages of the prepared device run (`python -m benchmarks.device_run`, whose docstring says what each measures):
one function per stage, run in a child process of its own, each returning its figures as one JSON-ready dict."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.device_config import DeviceRunConfig
from benchmarks.gpu_peaks import peak_tflops
from benchmarks.measures.peak import PeakSampler


def say(line: str) -> None:
    print(f"device_run: {line}", file=sys.stderr, flush=True)


def gpu_name(device: str) -> str | None:
    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else None


def nvidia_smi(*query: str) -> list[str]:
    """nvidia-smi's CSV lines for ``query`` (no header, no units); [] where there is no nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return []
    run = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         timeout=30)
    return [line.strip() for line in run.stdout.splitlines() if line.strip()] if run.returncode == 0 else []


# ------------------------------------------------------------------------------------------ environment
def environment(cfg: DeviceRunConfig) -> dict:
    """The machine: GPU, driver, torch and its CUDA, and why CUDA is unusable when a GPU is present but unused."""
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


# ------------------------------------------------------------------------------------------ golden tokens
def _golden_models():
    """The reference's small configuration with its seeded weights (tests/reference.py) and golden outputs."""
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
    """The golden tokens, logits and reconstruction (computed by the reference on the CPU) recomputed on the
    device in strict fp32: tokens that differ per scale, the largest logit and pixel differences."""
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


# ------------------------------------------------------------------------------------------ generation
def dynamo_counters() -> dict:
    """torch._dynamo's counters as plain dicts: graphs made, frames, graph breaks, recompile-limit hits."""
    from torch._dynamo.utils import counters

    from stylevar.runtime.compile import recompile_limit_hits

    raw = {group: {str(k): v for k, v in c.items()} for group, c in counters.items() if c}
    return {"graphs": raw.get("stats", {}).get("unique_graphs", 0), "recompile_limit_hits": recompile_limit_hits(),
            "graph_breaks": sum(raw.get("graph_break", {}).values()), "counters": raw}


def generation(cfg: DeviceRunConfig, compiled: bool) -> dict:
    """`stylevar bench` (stylevar.runtime.bench) at each batch size: ms/image, images/s, peak memory, the fraction
    of the GPU's peak; compiled, the graphs torch._dynamo made and its recompile-limit hits."""
    from torch._dynamo.utils import counters

    from stylevar.runtime.bench import BenchConfig, run

    peak = peak_tflops(gpu_name(cfg.device) or "")
    bench = BenchConfig(preset=cfg.preset, device=cfg.device, batch_sizes=cfg.batch_sizes, repeats=cfg.repeats,
                        warmup=cfg.warmup, compile=compiled, compile_backend=cfg.compile_backend, tf_batch=1,
                        peak_tflops=peak)
    counters.clear()
    result = run(bench, progress=say)
    return {**dataclasses.asdict(result), "compile_backend": cfg.compile_backend if compiled else None,
            "dynamo": dynamo_counters()}


# ------------------------------------------------------------------------------------------ training step
def sft_step(cfg: DeviceRunConfig) -> dict:
    """One SFT optimizer step in bf16 autocast (benchmarks.train_step's measurement, this project's step alone)."""
    from benchmarks.measures.train_step import measure
    from benchmarks.train_step_config import StepBenchConfig

    peak = peak_tflops(gpu_name(cfg.device) or "") or 0.0
    step = StepBenchConfig(batch_sizes=(cfg.train_batch,), precisions=("bf16",), repeats=cfg.repeats,
                           warmup=cfg.warmup, threads=os.cpu_count() or 1, reference=False, preset=cfg.preset,
                           device=cfg.device, peak_tflops=peak, variants=(cfg.train_variant,))
    return measure(step)


# ------------------------------------------------------------------------------------------ the service
def process_memory(pid: int) -> dict:
    """A process's GPU memory (nvidia-smi, MiB; None without one) and its peak resident host memory (MiB)."""
    gpu = None
    for line in nvidia_smi("--query-compute-apps=pid,used_memory"):
        app_pid, used = (x.strip() for x in line.split(",")[:2])
        if app_pid == str(pid):
            gpu = (gpu or 0) + int(used)
    host = None
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                host = int(line.split()[1]) / 1024
    return {"gpu_mib": gpu, "host_peak_rss_mib": host}


def service(cfg: DeviceRunConfig, time_left: Callable[[], float]) -> dict:
    """`python -m serve --device DEVICE` on a random model of the preset, then `cfg.requests` clients sending
    `POST /stylize` back to back for `cfg.serve_seconds` (benchmarks.load_test): statuses, p50/p99, memory."""
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
