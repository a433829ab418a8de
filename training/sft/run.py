"""An SFT run (``python -m training.sft``, whose options it takes): the checks of its inputs, RUN/ (its config
written or checked, to resume), the data and the token cache, the step loop with its log lines,
validations and checkpoints, and RUN/final, a model directory."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from torch import nn
from torch.utils.data import Dataset

from stylevar.utils.atomic import atomic_write_text
from stylevar.config import StyleVARConfig, VQVAEConfig
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.models.pretrained import CONFIG_FILE
from stylevar.models.tokenizer import MultiScaleVQVAE
from stylevar.models.transformer import StyleVAR
from training.parts.data import AugmentConfig, check_data_args, collate_triplets, dataset_size, open_triplets
from training.parts.extension import RunExtension
from training.parts.optim import ScheduleConfig, make_adamw, two_level_scheduler
from training.parts import fsdp
from training.parts.cli import FREE_KEYS, loop_config, resolve_hub_options
from training.parts.distributed import DistEnv, wrap_ddp
from training.parts.log import MetricWindow
from stylevar.utils.precision import make_grad_scaler, resolve_precision
from training.parts.rng import process_seed, seed_everything
from training.parts.run import TrainingRun, on_every_process
from training.parts.rundir import RunDir
from training.parts.schedule import LoopConfig
from training.parts.skips import SkipTracker
from training.parts.state import TrainingState
from training.parts.step import objective_steps
from training.parts.streams import BatchStreamConfig, loader_policy, make_stream, move_to
from training.parts.presets import load_preset, match_transformer
from training.sft.model import build_model, prepare_model, read_tokenizer, resolve_compile
from training.sft.objective import SFTObjective, validate
from training.parts.token_cache import TokenCache, TokenCacheError, open_token_cache, why_not_by_default

# options added after runs began, with what such a run computed (it resumes when they are left so)
ADDED_OPTIONS = {"drop_path_rate": None, "transformer_config.drop_path_rate": 0.0, "augment_palette": False}


def check_inputs(args: argparse.Namespace) -> None:
    """Fail fast, before any work, on missing inputs (hub ids resolved first)."""
    check_data_args(args.data)
    resolve_hub_options(args, "tokenizer", "init")
    tok = Path(args.tokenizer)
    if not tok.exists():
        raise SystemExit(f"error: --tokenizer {tok}: not found")
    if tok.is_dir() and not ((tok / CONFIG_FILE).is_file() and (tok / MultiScaleVQVAE.weights_file).is_file()):
        raise SystemExit(f"error: --tokenizer {tok}: folder lacks {CONFIG_FILE} or {MultiScaleVQVAE.weights_file}")
    for flag, value in (("--init-var", args.init_var), ("--init", args.init)):
        if value and not Path(value).exists():
            raise SystemExit(f"error: {flag} {value}: not found")
    if not 0 <= args.label_smoothing < 1:
        raise SystemExit("error: --label-smoothing must be in [0, 1)")
    if args.add_variants and not args.init:
        raise SystemExit("error: --add-variants needs --init (the model the variants are added to)")
    if not 0 <= args.scale_gamma <= 2:
        raise SystemExit("error: --scale-gamma must be in [0, 2]")
    if not 0 <= args.alpha_jitter < 1:
        raise SystemExit("error: --alpha-jitter must be in [0, 1)")
    if args.drop_path_rate is not None and not 0 <= args.drop_path_rate < 1:
        raise SystemExit("error: --drop-path-rate must be in [0, 1)")
    if args.token_cache and (not args.no_augment or args.augment_palette):
        raise SystemExit("error: --token-cache needs --no-augment and no --augment-palette (augmented images, "
                         "and their tokens, differ every epoch)")
    if args.strategy == "fsdp" and args.precision == "fp16":
        raise SystemExit("error: --strategy fsdp trains in bf16 or fp32; fp16 loss scaling is not supported with it")


def execute(args: argparse.Namespace) -> int:
    """``python -m training.sft`` once its options are parsed: the checks, then the run (on every process)."""
    check_inputs(args)
    try:
        vq_preset, tr_preset = load_preset(args.preset)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    return on_every_process(args.device, lambda env: train(args, vq_preset, tr_preset, env))


def schedule(options: Mapping[str, Any]) -> ScheduleConfig:
    """The two-level learning rate with warm-up, for ``vars(args)`` or a run's config."""
    return ScheduleConfig(max_steps=options["max_steps"], warmup_steps=options["warmup_steps"],
                          drop_step=options["lr_drop_step"], drop_fraction=options["lr_drop_fraction"],
                          drop_factor=options["lr_drop_factor"])


def open_run(args: argparse.Namespace, vq_preset: VQVAEConfig, tr_preset: StyleVARConfig,
             env: DistEnv) -> tuple[MultiScaleVQVAE, RunDir]:
    """The frozen tokenizer, and RUN/ (its config written, or checked against the earlier run's)."""
    try:
        vqvae = read_tokenizer(args.tokenizer, vq_preset, args.image_size)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: --tokenizer {args.tokenizer}: {e}") from None
    config = {"recipe": "sft", **vars(args), "tokenizer_config": vqvae.cfg.to_dict(),
              "transformer_config": match_transformer(tr_preset, vqvae.cfg).to_dict()}
    run = RunDir.prepare(args.out, config, env, free_keys=(*FREE_KEYS, "activation_checkpointing", "name",
                                                           "token_cache", "compile"), absent_as=ADDED_OPTIONS,
                         extension=RunExtension(schedule))
    return vqvae, run


def augment_config(args: argparse.Namespace) -> AugmentConfig | None:
    """The training split's augmentations the options ask for (None: plain crops)."""
    if args.augment_palette:
        return AugmentConfig(geometry=not args.no_augment, palette_permute=True)
    return None if args.no_augment else AugmentConfig()


def open_datasets(args: argparse.Namespace, image_size: int) -> tuple[Dataset, Dataset | None]:
    """The train split (augmented unless --no-augment) and the val split (None when there is none)."""
    augment = augment_config(args)
    train_set = open_triplets(args.data, "train", image_size, augment, seed=args.seed, shuffle=True)
    try:
        val_set = open_triplets(args.data, "val", image_size, None, seed=args.seed)
    except (ValueError, FileNotFoundError):  # no val split
        val_set = None
    return train_set, val_set


def _cache_progress(chunk: int, chunks: int) -> None:
    if chunk % 20 == 0 or chunk == chunks - 1:
        print(f"[sft] token cache: encoded chunk {chunk + 1} of {chunks}", file=sys.stderr, flush=True)


def open_cache(args: argparse.Namespace, train_set: Dataset, model: StyleVAR, env: DistEnv,
               notes: list[str], num_workers: int) -> TokenCache | None:
    """The train split's token maps, built where missing, or None (why not by default goes to ``notes``)."""
    if args.token_cache is None:
        why = why_not_by_default(train_set, augment_config(args) is not None, args.max_steps * args.batch_size)
        notes.append(f"token cache off by default: {why}" if why else "token cache on by default "
                     "(--no-token-cache to encode every step)")
        if why:
            return None
    elif not args.token_cache:
        return None
    try:
        return open_token_cache(train_set, model.tokenizer, env, batch_size=max(1, args.batch_size // env.world_size),
                                num_workers=num_workers, on_chunk=_cache_progress if env.is_main else None)
    except TokenCacheError as e:
        raise SystemExit(f"error: --token-cache: {e}") from None


@dataclass
class SFTRun:
    """What the step loop of one SFT run works with."""

    args: argparse.Namespace
    env: DistEnv
    precision: str
    model: StyleVAR
    objective: SFTObjective
    ddp: nn.Module  # the objective, DDP-wrapped or sharded (--strategy fsdp)
    val_set: Dataset | None
    skips: SkipTracker
    cache: TokenCache | None = None  # --token-cache: the batch's token maps come from it

    def __post_init__(self):
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]

    def to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        batch = self.skips.take(batch)
        if self.cache is None:
            return move_to({k: batch[k] for k in ("content", "style", "target")}, self.env.device)
        fed = {"content": batch["content"], "style": batch["style"], "tokens_B3L": self.cache.lookup(batch["index"])}
        return move_to(fed, self.env.device)

    def validation(self) -> dict[str, float]:
        with fsdp.gathered(self.ddp):
            return validate(self.model, self.val_set, self.env, self.args.val_batch_size, self.precision,
                            self.args.val_max_batches)

    def steps(self, tr: TrainingRun, cfg: LoopConfig) -> int:
        validation = self.validation if self.val_set is not None else None
        return objective_steps(tr, cfg, self.trainable, self.ddp, self.to_device, MetricWindow(self.env),
                               lambda: len(self.skips.all_paths()), validation=validation,
                               checkpoint_extra=lambda: {"draws": self.objective.draws})

    def final_writer(self) -> Callable[[Path], None]:
        """What writes RUN/final (a sharded model is gathered to rank 0 first: every rank calls this)."""
        args, model = self.args, self.model
        whole = None
        if fsdp.is_sharded(self.ddp):
            whole = fsdp.strip_prefix(fsdp.full_state_dict(self.ddp), "model.")

        def write_final(folder: Path) -> None:
            extra = {"recipe": "sft", "steps": args.max_steps, "data": args.data, "batch_size": args.batch_size,
                     "lr": args.lr, "init_var": args.init_var, "init": args.init}
            final = model
            if whole is not None:
                final = StyleVAR(model.cfg, MultiScaleVQVAE(model.tokenizer.cfg))
                final.load_state_dict(whole)
            StylePipeline.from_models(final, name=args.name, extra=extra).save_pretrained(folder)
        return write_final


def log_start(tr: TrainingRun, args: argparse.Namespace, intro: str, notes: list[str],
              summary: dict[str, Any] | None) -> None:
    """The run's first lines: ``intro``, and on a fresh run the model's initialisation."""
    log = tr.log
    log.info(intro)
    if tr.start != 0:
        return
    for line in notes:
        log.info(line)
    if summary is not None:
        if tr.env.is_main:
            atomic_write_text(tr.run.root / "init_summary.json", json.dumps(summary, indent=1))
        log.log(0, {"event": "init_from_var", "source": str(args.init_var),
                    "copied": len(summary["copied"]), "split": len(summary["split"]),
                    "dropped": summary["dropped"], "fresh": len(summary["fresh"]),
                    "encoders": summary["encoders"]}, prefix="init")


def train(args: argparse.Namespace, vq_preset: VQVAEConfig, tr_preset: StyleVARConfig, env: DistEnv) -> int:
    precision = resolve_precision(args.precision, env.device)
    vqvae, run = open_run(args, vq_preset, tr_preset, env)
    train_set, val_set = open_datasets(args, vqvae.cfg.image_size)
    notes: list[str] = []
    try:
        model, summary = build_model(args, tr_preset, vqvae, notes)
    except ValueError as e:  # CheckpointError included: wrong layout or shapes for this preset
        raise SystemExit(f"error: cannot initialise the model: {e}") from None
    seed_everything(process_seed(args.seed, env.rank))  # model init above is the same on every rank
    sharded = args.strategy == "fsdp"
    args.compile, compile_note = resolve_compile(args, env.device)
    prepare_model(model, args, env)
    speed_notes = [compile_note]
    loader = loader_policy(args.num_workers, env.device)
    cache = open_cache(args, train_set, model, env, speed_notes, loader.num_workers)
    objective = SFTObjective(model, label_smoothing=args.label_smoothing, alpha_jitter=args.alpha_jitter,
                             seed=args.seed, scale_gamma=args.scale_gamma)
    ddp = fsdp.shard_model(objective, model, env, precision) if sharded else wrap_ddp(objective, env)
    # AdamW's fused kernel on every device and strategy (FSDP's DTensor shards too): one arithmetic for DDP and FSDP
    optimizer = make_adamw(model, args.lr, args.weight_decay, betas=(0.9, 0.95), fused=True)
    sched = schedule(run.config)  # the options as config.json holds them: a drop already passed kept (extension)
    scheduler = two_level_scheduler(optimizer, sched)
    stream = make_stream(train_set, BatchStreamConfig(global_batch=args.batch_size, grad_accum=args.grad_accum,
                                                      seed=args.seed, loader=loader, collate_fn=collate_triplets), env)
    job = SFTRun(args, env, precision, model, objective, ddp, val_set, SkipTracker(env), cache)
    state = TrainingState(ddp, optimizer, scheduler, stream, env, scaler=make_grad_scaler(precision, env.device),
                          sharded=sharded)
    intro = (f"{dataset_size(train_set)} training triplets, {dataset_size(val_set)} validation, "
             f"{vqvae.cfg.image_size}px, patch_nums {vqvae.cfg.patch_nums}, "
             f"{sum(p.numel() for p in job.trainable) / 1e6:.2f}M trainable parameters "
             "(the transformer with its image encoders; the tokenizer is frozen), "
             f"world size {env.world_size}, {precision}, lr drop at step {sched.resolved_drop_step}, "
             f"drop path {model.cfg.drop_path_rate:.4g}")
    cfg = loop_config(args, precision)
    with TrainingRun.for_loop(run, state, cfg) as tr:
        if tr.resumed.path is not None:
            objective.draws = int(tr.resumed.extra.get("draws", 0))  # keys the alpha jitter
        log_start(tr, args, intro, notes, summary)
        for line in [*run.notes, *speed_notes, *([cache.describe()] if cache is not None else [])]:
            tr.log.info(line)
        step = job.steps(tr, cfg)
        tr.finish(step, job.final_writer())
    job.skips.report(run, {**getattr(train_set, "skipped", {}), **(getattr(val_set, "skipped", {}) or {})})
    return 0
