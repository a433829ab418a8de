"""A GRPO run (``python -m training.grpo``, whose options it takes): the checks of its inputs, the configs made
from the options, RUN/ (its config written or checked, to resume), the policy with LoRA attached, the step
loop with its log lines and checkpoints (the merge state included), and RUN/final with LoRA merged."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, Callable, Mapping

from stylevar.utils.precision import resolve_autocast_dtype
from stylevar.models.lora import LoRAConfig, attach_lora, lora_parameters, unload_lora
from stylevar.loaders.model_dir import ModelDirError, check_model_dir
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.models.transformer import StyleVAR
from training.parts.data import check_data_args, collate_triplets, dataset_size, open_triplets
from training.grpo.trainer import GRPOConfig, GRPOTrainer
from training.grpo.merge_control import MergeConfig
from training.parts.extension import RunExtension
from training.parts.optim import ScheduleConfig, make_adamw, two_level_scheduler
from training.parts import cli
from training.parts.cli import loop_config, resolve_hub_options
from training.parts.distributed import DistEnv
from training.parts.log import MetricWindow
from stylevar.utils.precision import resolve_precision
from training.parts.run import TrainingRun, on_every_process
from training.parts.rundir import RunDir
from training.parts.schedule import LoopConfig
from training.parts.state import TrainingState
from training.parts.streams import BatchStreamConfig, loader_policy, make_stream, move_to
from training.grpo.rewards import Reward, RewardConfig

SUM_KEYS = ("merged", "emergency", "skipped")  # counted over a log window; the rest averaged
LAST_KEYS = ("reward_ema", "merges_total")  # their value at the logged step
# options that may change when a run is resumed (they do not change what is computed)
FREE_KEYS = (*cli.FREE_KEYS, "rollout_chunk", "tf_chunk")


def check_inputs(args: argparse.Namespace) -> None:
    check_data_args(args.data)
    resolve_hub_options(args, "init")
    try:
        check_model_dir(args.init)
    except ModelDirError:
        raise SystemExit(f"error: --init {args.init}: not a model directory (config.json + *.safetensors)") from None
    except ValueError as e:
        raise SystemExit(f"error: --init {args.init}: {e}") from None
    if args.grad_accum != 1:
        raise SystemExit("error: --grad-accum is not used by GRPO; bound memory with --rollout-chunk and --tf-chunk")


def execute(args: argparse.Namespace) -> int:
    """``python -m training.grpo`` once its options are parsed (on every process)."""
    check_inputs(args)
    try:
        grpo_cfg = GRPOConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(GRPOConfig)
                                 if f.name != "batched_rollouts"})
        merge_cfg = MergeConfig(ema_decay=args.reward_ema, min_gain=args.merge_min_gain, patience=args.merge_patience,
                                cooldown=args.merge_cooldown, emergency_kl=args.emergency_kl,
                                emergency_cooldown=args.emergency_cooldown, skip_kl=args.skip_kl,
                                enabled=not args.no_merge)
        lora_cfg = LoRAConfig(rank=args.lora_rank, alpha=args.lora_alpha)
        reward_cfg = RewardConfig(args.reward, args.reward_scale, args.reward_image_size, args.lpips_net,
                                  style_weight=args.reward_style_weight)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    return on_every_process(args.device, lambda env: train(args, grpo_cfg, merge_cfg, lora_cfg, reward_cfg, env))


def final_writer(model: StyleVAR, base_config: Any, args: argparse.Namespace) -> Callable[[Path], None]:
    """What writes RUN/final: the model with LoRA merged, as a plain model directory."""
    def write_final(folder: Path) -> None:
        unload_lora(model, merge=True)
        extra = {**base_config.extra, "recipe": "grpo", "init": str(args.init), "steps": args.max_steps,
                 "reward": args.reward, "group_size": args.group_size, "lora_rank": args.lora_rank,
                 "lora_alpha": args.lora_alpha}
        model_cfg = dataclasses.replace(base_config, name=args.name, demo=False, extra=extra)
        StylePipeline(model, model_cfg).save_pretrained(folder)
    return write_final


def schedule(options: Mapping[str, Any]) -> ScheduleConfig:
    """The learning rate: a linear warm-up, then constant, for ``vars(args)`` or a run's config."""
    return ScheduleConfig(max_steps=options["max_steps"], warmup_steps=options["warmup_steps"], drop_factor=1.0)


def grpo_steps(tr: TrainingRun, cfg: LoopConfig, trainer: GRPOTrainer, saved: Mapping[str, Any]) -> int:
    """The steps from ``tr.start`` to ``cfg.max_steps`` with log lines and checkpoints; returns the last step."""
    log, start, env, stream = tr.log, tr.start, tr.env, tr.state.stream
    step = start
    window = MetricWindow(env, last=LAST_KEYS, summed=SUM_KEYS, over_ranks=False)  # stats agree on all ranks
    while step < cfg.max_steps:
        batch = move_to({k: v for k, v in stream.next().items() if k in ("content", "style", "target")}, env.device)
        lr = trainer.optimizer.param_groups[0]["lr"]
        stats = trainer.step(batch, step + 1)
        step += 1
        window.add(stats)
        if cfg.log_due(step):
            log.log(step, {**window.record(), "lr": lr})
            log.advance(step, {"reward": stats["reward_mean"], "kl": stats["kl"]})
        if tr.progress.first_lines_due(step) and step < cfg.max_steps:
            log.info(tr.progress.line(step))
        if tr.checkpoint_due(step):
            tr.save(step, extra={"merge": trainer.controller.state_dict(), **saved})
    return step


def train(args: argparse.Namespace, grpo_cfg: GRPOConfig, merge_cfg: MergeConfig, lora_cfg: LoRAConfig,
          reward_cfg: RewardConfig, env: DistEnv) -> int:
    precision = resolve_precision(args.precision, env.device)
    if precision == "fp16":
        raise SystemExit("error: --precision fp16 is not supported for GRPO rollouts; use bf16 or fp32")
    config = {"recipe": "grpo", **vars(args)}
    run = RunDir.prepare(args.out, config, env, free_keys=FREE_KEYS, extension=RunExtension(schedule))
    pipe = StylePipeline.from_pretrained(args.init, device=env.device, threads="torch")  # the recipe's own count
    model = pipe.model
    model.autocast_dtype = resolve_autocast_dtype(precision, env.device)  # rollouts only (bf16 or None)
    dataset = open_triplets(args.data, "train", pipe.image_size, None, seed=args.seed, shuffle=True)
    reward = Reward(reward_cfg, env.device)  # missing metric weights fail here, before any work

    attach_lora(model, lora_cfg, seed=args.seed)
    model.eval()
    optimizer = make_adamw(model, args.lr, args.weight_decay, betas=(0.9, 0.95))
    scheduler = two_level_scheduler(optimizer, schedule(vars(args)))
    stream = make_stream(dataset, BatchStreamConfig(global_batch=args.batch_size, seed=args.seed,
                                                    loader=loader_policy(args.num_workers, env.device),
                                                    collate_fn=collate_triplets), env)
    trainer = GRPOTrainer(model, reward, grpo_cfg, merge_cfg, optimizer, scheduler, env)
    state = TrainingState(model, optimizer, scheduler, stream, env)
    n_lora = sum(p.numel() for p in lora_parameters(model))
    cfg = loop_config(args, precision)
    with TrainingRun.for_loop(run, state, cfg) as tr:
        if tr.resumed.path is not None:
            trainer.controller.load_state_dict(tr.resumed.extra["merge"])
        tr.log.info(f"{dataset_size(dataset)} training triplets, {pipe.image_size}px, G={grpo_cfg.group_size}, "
                    f"batch {args.batch_size} ({args.batch_size * grpo_cfg.group_size} rollouts/step), reward "
                    f"{reward_cfg.name} x{reward_cfg.scale}, LoRA r={lora_cfg.rank} alpha={lora_cfg.alpha} "
                    f"({n_lora / 1e6:.3f}M trainable), world size {env.world_size}, rollouts {precision}")
        step = grpo_steps(tr, cfg, trainer, {"pipeline_config": pipe.config.to_dict(), "lora": lora_cfg.to_dict()})
        tr.finish(step, final_writer(model, pipe.config, args))
    return 0
