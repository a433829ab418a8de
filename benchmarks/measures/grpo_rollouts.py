"""The measurements of `python -m benchmarks.grpo_rollouts`: GRPO steps with batched rollouts against a loop of
single-row generate calls, taking turns step by step."""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from data_tools.synth import SynthConfig, generate
from stylevar.models.lora import LoRAConfig, attach_lora
from stylevar.config import presets
from stylevar.loaders.model_dir import PipelineConfig
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.utils.threads import apply_threads
from training.parts.data import collate_triplets, open_triplets
from training.parts.grpo_trainer import GRPOConfig, GRPOTrainer
from training.parts.merge_control import MergeConfig
from training.parts.optim import make_adamw
from training.parts.distributed import DistEnv
from training.parts.rewards import Reward, RewardConfig


def build_trainer(args: argparse.Namespace, batched: bool, device: torch.device) -> GRPOTrainer:
    if args.model:
        pipe = StylePipeline.from_pretrained(args.model, device=device)
    else:
        pipe = StylePipeline.random(args.preset, seed=0).to(device)
    model = pipe.model
    model.autocast_dtype = torch.bfloat16 if device.type == "cuda" else None
    attach_lora(model, LoRAConfig(rank=args.lora_rank, alpha=2.0 * args.lora_rank), seed=0)
    model.eval()
    opt = make_adamw(model, 1e-5, 0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    env = DistEnv(0, 1, 0, device)
    cfg = GRPOConfig(group_size=args.group_size, batched_rollouts=batched, rollout_chunk=args.rollout_chunk,
                     tf_chunk=args.tf_chunk)
    reward = Reward(RewardConfig("ssim", 5.0, image_size=pipe.image_size), device)
    return GRPOTrainer(model, reward, cfg, MergeConfig(enabled=False), opt, sched, env)


def timed_step(trainer: GRPOTrainer, batch: dict, step: int, device: torch.device) -> tuple[float, float]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    stats = trainer.step(batch, step=step)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, stats["t_rollout"]


def run(args, batches: list[dict], device: torch.device) -> tuple[dict, dict, int]:
    """Both modes step by step in turn (so a change in machine load hits both alike)."""
    trainers = {"batched": build_trainer(args, True, device), "loop": build_trainer(args, False, device)}
    times: dict[str, dict[str, list[float]]] = {m: {"step_s": [], "rollout_s": []} for m in trainers}
    same = 0
    for i, batch in enumerate(batches):
        for mode, trainer in trainers.items():
            step_s, rollout_s = timed_step(trainer, batch, i + 1, device)
            if i >= args.warmup:
                times[mode]["step_s"].append(step_s)
                times[mode]["rollout_s"].append(rollout_s)
        tb, tl = trainers["batched"].last_tokens, trainers["loop"].last_tokens
        same += int(all(torch.equal(x, y) for x, y in zip(tb, tl)))
    mean = {m: {k: statistics.mean(v) for k, v in t.items()} for m, t in times.items()}
    return mean["batched"], mean["loop"], same


def measure(args: argparse.Namespace) -> dict:
    """The two modes timed on synthetic triplets (what `python -m benchmarks.grpo_rollouts` prints)."""
    apply_threads(args.threads or "torch")  # 0: torch's count as it is
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    size = (PipelineConfig.from_dir(args.model) if args.model else PipelineConfig(*presets(args.preset))).tokenizer.image_size
    n_steps = args.warmup + args.steps
    with tempfile.TemporaryDirectory() as tmp:
        manifest = generate(SynthConfig(out=str(Path(tmp) / "data"), count=n_steps * args.batch_size, size=size,
                                        seed=0, val_fraction=0.0))
        ds = open_triplets(manifest, "train", size, None)
        batches = []
        for s in range(n_steps):
            b = collate_triplets([ds[s * args.batch_size + j] for j in range(args.batch_size)])
            batches.append({k: b[k].to(device) for k in ("content", "style", "target")})
    batched, looped, same = run(args, batches, device)
    result = {
        "device": str(device), "threads": torch.get_num_threads(), "model": args.model or f"random {args.preset}",
        "image_size": size, "group_size": args.group_size, "batch_size": args.batch_size,
        "rollouts_per_step": args.group_size * args.batch_size, "timed_steps": args.steps,
        "batched": batched, "loop": looped,
        "step_ratio_loop_over_batched": looped["step_s"] / batched["step_s"],
        "rollout_ratio_loop_over_batched": looped["rollout_s"] / batched["rollout_s"],
        "steps_with_identical_tokens": f"{same}/{n_steps}",
    }
    return result
