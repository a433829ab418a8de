"""Supervised fine-tuning of StyleVAR on (content, style, target) triplets: ``python -m training.sft``.

    python -m training.sft --data MANIFEST_OR_SHARDS [--data ...] --preset tiny|d16|d20 \
        --tokenizer DIR_OR_PTH --out RUN --max-steps N --batch-size B [--grad-accum K] \
        [--init-var VAR.pth | --init MODEL_DIR_OR_PTH]
    torchrun --nproc_per_node G -m training.sft ...          # the same run on G processes
    torchrun --nnodes N --nproc-per-node G --rdzv-backend c10d --rdzv-endpoint HOST:PORT -m training.sft ...
    torchrun ... -m training.sft --strategy fsdp ...          # weights, grads, AdamW state sharded (FSDP2)

Objective: teacher-forced cross-entropy over all L target tokens with label smoothing
(``model.teacher_forcing_logits(content, style, target_indices)``, target tokens from the frozen
tokenizer). AdamW (0.9, 0.95), no weight decay on embeddings, norms, biases and attention scales; the
paper's two-level lr (``--lr`` until ``--lr-drop-step`` or ``--lr-drop-fraction`` of the steps, then
``--lr * --lr-drop-factor``; paper: 5e-4 for epochs 1-6 of 10, then 1e-4) after a linear warmup; grad
clipping; bf16 autocast on CUDA. ``--alpha-jitter J`` draws the per-scale blend alphas uniformly in
``alpha +- J`` (clamped to [0.01, 0.99]) for each micro-batch, the same on every rank. Stochastic depth as
the reference trains (``StyleVARConfig.drop_path_rate``: the published presets 0.1 * depth / 24, tiny 0;
``--drop-path-rate`` overrides the model's).

The step (benchmarks/train_step.py measures it against the reference's): target, style and content through
the tokenizer in one call (`training.token_inputs`), or with ``--token-cache`` (needs ``--no-augment``) their
token maps read back from a cache beside the data (`training.token_cache`); AdamW's fused kernel; the
gradient norm in one foreach pass; on the CPU the convolutions in NHWC (`channels_last`); with ``--compile``
the blocks through torch.compile (`compile_blocks`).

Logged per step: ``loss`` (smoothed CE), ``ce`` (plain CE), ``acc`` (top-1 over all tokens), ``lr``;
validation: ``val_loss`` (plain CE), ``val_acc`` and ``val_acc_s{k}`` per scale. ``RUN/final/`` is a
model directory (``StylePipeline.from_pretrained(RUN/final)``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, IterableDataset

from stylevar import hub
from stylevar.pull import resolve_model
from stylevar.atomic import atomic_write_text
from stylevar.convert import load_stylevar, load_vqvae
from stylevar.config import StyleVARConfig, VQVAEConfig
from stylevar.model_dir import check_model_dir
from stylevar.pipeline import StylePipeline
from stylevar.pretrained import CONFIG_FILE
from stylevar.tokenizer import MultiScaleVQVAE
from stylevar.transformer import Condition, StyleVAR
from training import sharding
from training.data import AugmentConfig, check_data_args, collate_triplets, dataset_size, open_triplets
from training.optim import ScheduleConfig, make_adamw, two_level_scheduler
from training.parts.checkpoints import CheckpointsUnreadableError
from training.parts.cli import FREE_KEYS, add_loop_args, loop_config, recipe_parser
from training.parts.distributed import DistEnv, all_reduce_sum, setup_distributed, teardown_distributed, wrap_ddp
from training.parts.log import MetricWindow
from training.parts.precision import autocast, make_grad_scaler, resolve_precision
from training.parts.rng import derived_generator, process_seed, seed_everything
from training.parts.run import TrainingRun
from training.parts.scale_weights import panw_weights
from training.token_cache import TokenCache, TokenCacheError, open_token_cache
from training.token_inputs import condition_from_tokens, encode_triplets, tokens_from_indices
from training.var_init import init_from_var
from training.parts.rundir import RunConfigMismatchError, RunDir
from training.parts.schedule import LoopConfig
from training.parts.skips import SkipTracker
from training.parts.state import TrainingState
from training.parts.step import log_objective_window, objective_step
from training.parts.streams import BatchStreamConfig, eval_loader, make_stream, move_to
from training.presets import load_preset, match_transformer, resize_tokenizer


# options added after runs began, with what such a run computed (it resumes when they are left so)
ADDED_OPTIONS = {"drop_path_rate": None, "transformer_config.drop_path_rate": 0.0}


# ------------------------------------------------------------------------------------------ model inputs
def read_tokenizer(src: str, preset_cfg: VQVAEConfig, image_size: int | None) -> MultiScaleVQVAE:
    """The frozen tokenizer from a folder (``config.json`` + ``tokenizer.safetensors``: a training.vqvae
    RUN/final or a model directory) or a weights file (.pth / .safetensors) with the preset's config."""
    path = Path(src)
    if path.is_dir():
        vqvae = MultiScaleVQVAE.from_pretrained(path)
        if image_size is not None and image_size != vqvae.cfg.image_size:
            raise ValueError(f"--image-size {image_size} differs from the tokenizer's {vqvae.cfg.image_size}")
        return vqvae
    return load_vqvae(path, resize_tokenizer(preset_cfg, image_size))


def build_model(args: argparse.Namespace, tr_preset: StyleVARConfig, vqvae: MultiScaleVQVAE,
                log_lines: list[str]) -> tuple[StyleVAR, dict[str, Any] | None]:
    """A fresh, VAR-initialised or --init-loaded StyleVAR (seeded: the same on every rank)."""
    cfg = match_transformer(tr_preset, vqvae.cfg)
    summary = None
    seed_everything(args.seed)
    if args.init_var:
        model, summary = init_from_var(args.init_var, cfg, vqvae)
        log_lines.append(
            f"initialised from class-conditional VAR {args.init_var}: {len(summary['copied'])} tensors copied, "
            f"{len(summary['split'])} split into guide/target projections, {len(summary['dropped'])} dropped "
            f"({', '.join(summary['dropped'][:6])}), {len(summary['fresh'])} fresh, encoders {summary['encoders']}"
        )
    elif args.init:
        init = Path(args.init)
        if init.is_dir():
            check_model_dir(init)
            model = StyleVAR.from_pretrained(init, vqvae)
        else:
            model = load_stylevar(init, cfg, vqvae)
        log_lines.append(f"initialised from StyleVAR weights {args.init}")
        if args.add_variants:
            model = with_variants(model, args.add_variants)
            log_lines.append(f"variants added (zero-initialised, the same computation at step 0): {args.add_variants}")
    else:
        model = StyleVAR(cfg, vqvae)
        log_lines.append("transformer initialised from scratch")
    model.tokenizer.requires_grad_(False)
    if args.drop_path_rate is not None:
        set_drop_path_rate(model, args.drop_path_rate)
    return model, summary


VARIANT_MODULES = {"content_injection": "content_in", "colour_stats": "colour_in"}


def with_variants(model: StyleVAR, variants: list[str]) -> StyleVAR:
    """``model`` with opt-in variants turned on: their modules start at zero, so the model computes what it did;
    every other tensor is the model's own."""
    unknown = sorted(set(variants) - set(VARIANT_MODULES))
    if unknown:
        raise SystemExit(f"error: --add-variants: unknown {unknown} (known: {sorted(VARIANT_MODULES)})")
    grown = StyleVAR(dataclasses.replace(model.cfg, **{v: True for v in variants}), model.tokenizer)
    missing, unexpected = grown.load_state_dict(model.state_dict(), strict=False)
    added = tuple(f"{VARIANT_MODULES[v]}." for v in variants)
    if unexpected or any(not k.startswith(added) for k in missing):
        raise SystemExit(f"error: --add-variants {variants}: the weights do not fit (missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]})")
    return grown


def channels_last(model: StyleVAR) -> None:
    """The convolutions of both image encoders and of the frozen tokenizer in NHWC (oneDNN's faster layout on
    the CPU; the images are taken as they come): the same computation up to float rounding."""
    for part in (model.style_encoder, model.content_encoder, model.tokenizer):
        part.to(memory_format=torch.channels_last)


def compile_blocks(model: StyleVAR) -> None:
    """Each transformer block through torch.compile (Inductor fuses the elementwise work around the matrix
    products, forward and backward); its random draws (drop path) stay torch's eager ones, so a compiled
    run drops the rows an eager one does. The first step compiles (tens of seconds)."""
    import torch._inductor.config as inductor_config

    inductor_config.fallback_random = True
    for block in model.blocks:
        block.compile()


def set_drop_path_rate(model: StyleVAR, rate: float) -> None:
    """The model's stochastic-depth rate (its config, recorded in RUN/final, and each block's share)."""
    model.cfg = dataclasses.replace(model.cfg, drop_path_rate=rate)
    for block, p in zip(model.blocks, model.cfg.drop_path_rates):
        block.drop_path = p


# ------------------------------------------------------------------------------------------ objective
def jittered_alphas(base_K: torch.Tensor, jitter: float, g: torch.Generator) -> torch.Tensor:
    """alpha_k + U(-jitter, jitter), clamped to [0.01, 0.99]."""
    u = torch.rand(base_K.shape, generator=g, dtype=torch.float32) * 2 - 1
    return (base_K.cpu() + jitter * u).clamp(0.01, 0.99)


class SFTObjective(nn.Module):
    """One micro-batch of triplets -> (label-smoothed CE, metrics).

    The frozen tokenizer's token maps come from the batch's ``tokens_B3L`` when a token cache supplied them
    (`training.token_cache`), else from one encode of target, style and content together
    (``fuse_encodes``, `training.token_inputs`) or, with ``fuse_encodes=False``, from three (the target's
    here, the style's and content's inside `StyleVAR.condition`): the same token maps either way."""

    def __init__(self, model: StyleVAR, *, label_smoothing: float, alpha_jitter: float, seed: int,
                 fuse_encodes: bool = True, scale_gamma: float = 0.0):
        super().__init__()
        self.model = model
        self.label_smoothing, self.alpha_jitter, self.seed = label_smoothing, alpha_jitter, seed
        # gamma 0: the plain mean over tokens (the reference's loss); > 0: coarse scales weigh more (PANW)
        self.weights_L = panw_weights(model.cfg.patch_nums, scale_gamma) if scale_gamma > 0 else None
        self.fuse_encodes = fuse_encodes
        self.draws = 0  # micro-batches seen: keys the alpha jitter (checkpointed)

    def inputs(self, batch: dict[str, Any]) -> tuple[list[torch.Tensor], Condition | None]:
        """The target's K token maps and the condition (None: `teacher_forcing_logits` makes it)."""
        content, style, tokenizer = batch["content"], batch["style"], self.model.tokenizer
        if "tokens_B3L" in batch:
            tokens = tokens_from_indices(tokenizer, batch["tokens_B3L"])
        elif self.fuse_encodes:
            tokens = encode_triplets(tokenizer, batch["target"], style, content)[0]
        else:
            with torch.no_grad(), torch.autocast(content.device.type, enabled=False):
                return tokenizer.encode_indices(batch["target"]), None
        return tokens.target, condition_from_tokens(self.model, content, style, tokens)

    def forward(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        content, style = batch["content"], batch["style"]
        target_idx, cond = self.inputs(batch)
        alphas = None
        if self.alpha_jitter > 0:
            g = derived_generator(self.seed, self.draws, 0xA1FA)
            alphas = jittered_alphas(self.model.alpha_K, self.alpha_jitter, g).to(content.device)
        self.draws += 1
        logits_BLV = self.model.teacher_forcing_logits(content, style, target_idx, alphas=alphas, cond=cond)
        gt_BL = torch.cat(target_idx, dim=1)
        flat = logits_BLV.reshape(-1, logits_BLV.shape[-1])
        if self.weights_L is None:
            loss = F.cross_entropy(flat, gt_BL.reshape(-1), label_smoothing=self.label_smoothing)
        else:
            ce_BL = F.cross_entropy(flat, gt_BL.reshape(-1), label_smoothing=self.label_smoothing,
                                    reduction="none").view_as(gt_BL)
            loss = (ce_BL * self.weights_L.to(ce_BL.device)).sum(1).mean()
        with torch.no_grad():
            plain = self.label_smoothing or self.weights_L is not None
            ce = F.cross_entropy(flat, gt_BL.reshape(-1)) if plain else loss.detach()
            acc = (logits_BLV.argmax(-1) == gt_BL).float().mean()
        return loss, {"ce": ce.detach(), "acc": acc}


@torch.no_grad()
def validate(model: StyleVAR, dataset: Dataset | None, env: DistEnv, batch_size: int, precision: str,
             max_batches: int = 0) -> dict[str, float]:
    """Plain CE and top-1 accuracy over the val split (all ranks; sums reduced), per scale too."""
    if dataset is None:
        return {}
    was_training = model.training
    model.eval()
    patch_nums = model.cfg.patch_nums
    K = len(patch_nums)
    sums = torch.zeros(2 + K, dtype=torch.float64)  # CE sum, token count, correct per scale
    counts_K = torch.tensor([pn * pn for pn in patch_nums], dtype=torch.float64)
    if isinstance(dataset, IterableDataset):
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, collate_fn=collate_triplets)
    else:
        loader = eval_loader(dataset, batch_size, env, collate_fn=collate_triplets)
    images = 0
    for b, batch in enumerate(loader):
        if max_batches and b >= max_batches:
            break
        content, style, target = (batch[k].to(env.device) for k in ("content", "style", "target"))
        target_idx = model.tokenizer.encode_indices(target)
        with autocast(precision, env.device):
            logits_BLV = model.teacher_forcing_logits(content, style, target_idx)
        gt_BL = torch.cat(target_idx, dim=1)
        ce = F.cross_entropy(logits_BLV.float().reshape(-1, logits_BLV.shape[-1]), gt_BL.reshape(-1), reduction="sum")
        correct_BL = (logits_BLV.argmax(-1) == gt_BL).double()
        per_scale = torch.stack([c.sum() for c in correct_BL.split([pn * pn for pn in patch_nums], dim=1)])
        sums += torch.cat([torch.stack([ce.double().cpu(), torch.tensor(float(gt_BL.numel()), dtype=torch.float64)]),
                           per_scale.cpu()])
        images += content.shape[0]
    model.train(was_training)
    total = all_reduce_sum(sums, env)
    n_img = float(all_reduce_sum(torch.tensor([float(images)]), env)[0])
    tokens = max(float(total[1]), 1.0)
    out = {"val_loss": float(total[0]) / tokens, "val_acc": float(total[2:].sum()) / tokens, "val_images": int(n_img)}
    for k in range(K):
        out[f"val_acc_s{k}"] = float(total[2 + k]) / max(n_img * float(counts_K[k]), 1.0)
    return out


# ------------------------------------------------------------------------------------------ CLI
def build_parser() -> argparse.ArgumentParser:
    p = recipe_parser("training.sft", __doc__)
    p.add_argument("--preset", default="tiny", help="tiny|d16|d20|d24|d30 or a JSON preset file")
    p.add_argument("--tokenizer", required=True,
                   help="tokenizer folder (training.vqvae RUN/final or a model dir) or weights file (.pth/.safetensors)")
    init = p.add_mutually_exclusive_group()
    init.add_argument("--init-var", metavar="PTH", help="initialise from a class-conditional VAR checkpoint")
    init.add_argument("--init", metavar="DIR_OR_PTH",
                      help="initialise from StyleVAR weights (model dir, checkpoint, or hub id hf:OWNER/NAME[:variant])")
    p.add_argument("--image-size", type=int, default=None, help="default: the tokenizer's")
    p.add_argument("--label-smoothing", type=float, default=0.1, help="label smoothing of the cross-entropy")
    p.add_argument("--add-variants", type=lambda v: [x for x in v.split(",") if x], default=[],
                   help="with --init: turn on opt-in variants the initial model lacks, comma-separated "
                        "(content_injection, colour_stats); their modules start at zero")
    p.add_argument("--scale-gamma", type=float, default=0.0,
                   help="weigh a token of scale k by (h_k w_k)^-gamma in the loss (PANW's weights; 0: the plain "
                        "mean over tokens, the reference's; 1: every scale the same share)")
    p.add_argument("--alpha-jitter", type=float, default=0.0, help="random +- jitter of the per-scale alphas during training (0: off)")
    p.add_argument("--lr-drop-step", type=int, default=None, help="step at which the lr drops (overrides the fraction)")
    p.add_argument("--lr-drop-fraction", type=float, default=0.6, help="fraction of --max-steps at which the lr drops")
    p.add_argument("--lr-drop-factor", type=float, default=0.2, help="lr after the drop = lr * factor (5e-4 -> 1e-4)")
    p.add_argument("--no-augment", action="store_true", help="plain centre crops (no rotation, jitter, style crops)")
    p.add_argument("--val-batch-size", type=int, default=32, help="triplets per validation batch")
    p.add_argument("--val-max-batches", type=int, default=0, help="cap on validation batches per rank (0: all)")
    p.add_argument("--name", default="stylevar-sft", help="model name written to RUN/final/config.json")
    p.add_argument("--drop-path-rate", type=float, default=None,
                   help="stochastic depth: block i drops its branches with probability linspace(0, rate, depth)[i] "
                        "(default: the model's config; the published presets 0.1 * depth / 24, tiny 0)")
    p.add_argument("--token-cache", action="store_true",
                   help="encode every training triplet with the frozen tokenizer once and read the token maps "
                        "back in later epochs and runs (stored beside the data; needs --no-augment and a "
                        "manifest; see training.token_cache)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each transformer block (the same result to float rounding; the first step "
                        "compiles for tens of seconds; needs a C++ compiler on the CPU)")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="recompute block activations in the backward pass (less memory, same result)")
    p.add_argument("--strategy", choices=sharding.STRATEGIES, default="ddp",
                   help="ddp: every process holds the whole model, gradients and optimizer state; fsdp: all three "
                        "sharded over the processes (FSDP2, sharded checkpoints; see training.sharding)")
    add_loop_args(p, lr=5e-4, batch_size=32, max_grad_norm=2.0)
    return p


def check_inputs(args: argparse.Namespace) -> None:
    """Fail fast, before any work, on missing inputs. A hub id given to --tokenizer or --init (a published
    model, hf:OWNER/NAME[:variant]) becomes its model directory here, pulled on first use."""
    check_data_args(args.data)
    for flag in ("tokenizer", "init"):
        value = getattr(args, flag)
        if hub.is_hub_id(value):
            try:
                setattr(args, flag, str(resolve_model(value)))
            except (hub.HubError, ValueError) as e:
                raise SystemExit(f"error: --{flag} {value}: {e}") from None
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
    if args.token_cache and not args.no_augment:
        raise SystemExit("error: --token-cache needs --no-augment (augmented images, and their tokens, differ "
                         "every epoch)")
    if args.strategy == "fsdp" and args.precision == "fp16":
        raise SystemExit("error: --strategy fsdp trains in bf16 or fp32; fp16 loss scaling is not supported with it")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_inputs(args)
    try:
        vq_preset, tr_preset = load_preset(args.preset)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    env = setup_distributed(args.device)
    try:
        code = train(args, vq_preset, tr_preset, env)
        env.barrier()  # every rank has finished before any leaves the group (gloo aborts a rank otherwise)
        return code
    except CheckpointsUnreadableError as e:
        raise SystemExit(f"error: {e}") from None
    finally:
        teardown_distributed()


# ------------------------------------------------------------------------------------------ the run
def open_run(args: argparse.Namespace, vq_preset: VQVAEConfig, tr_preset: StyleVARConfig,
             env: DistEnv) -> tuple[MultiScaleVQVAE, RunDir]:
    """The frozen tokenizer, and RUN/ (its config written, or checked against the earlier run's)."""
    try:
        vqvae = read_tokenizer(args.tokenizer, vq_preset, args.image_size)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: --tokenizer {args.tokenizer}: {e}") from None
    config = {"recipe": "sft", **vars(args), "tokenizer_config": vqvae.cfg.to_dict(),
              "transformer_config": match_transformer(tr_preset, vqvae.cfg).to_dict()}
    try:
        run = RunDir.prepare(args.out, config, env, free_keys=(*FREE_KEYS, "activation_checkpointing", "name",
                                                               "token_cache", "compile"), absent_as=ADDED_OPTIONS)
    except RunConfigMismatchError as e:
        raise SystemExit(f"error: {e}") from None
    return vqvae, run


def open_datasets(args: argparse.Namespace, image_size: int) -> tuple[Dataset, Dataset | None]:
    """The train split (augmented unless --no-augment) and the val split (None when there is none)."""
    augment = None if args.no_augment else AugmentConfig()
    train_set = open_triplets(args.data, "train", image_size, augment, seed=args.seed, shuffle=True)
    try:
        val_set = open_triplets(args.data, "val", image_size, None, seed=args.seed)
    except (ValueError, FileNotFoundError):  # no val split
        val_set = None
    return train_set, val_set


def _cache_progress(chunk: int, chunks: int) -> None:
    if chunk % 20 == 0 or chunk == chunks - 1:
        print(f"[sft] token cache: encoded chunk {chunk + 1} of {chunks}", file=sys.stderr, flush=True)


def open_cache(args: argparse.Namespace, train_set: Dataset, model: StyleVAR, env: DistEnv) -> TokenCache | None:
    """--token-cache: the train split's token maps, built where missing (module training.token_cache)."""
    if not args.token_cache:
        return None
    try:
        return open_token_cache(train_set, model.tokenizer, env, batch_size=max(1, args.batch_size // env.world_size),
                                num_workers=args.num_workers, on_chunk=_cache_progress if env.is_main else None)
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
        with sharding.gathered(self.ddp):
            return validate(self.model, self.val_set, self.env, self.args.val_batch_size, self.precision,
                            self.args.val_max_batches)

    def steps(self, tr: TrainingRun, cfg: LoopConfig) -> int:
        """The steps from ``tr.start`` to ``cfg.max_steps``, with their log lines, validations and
        checkpoints, then the final validation; returns the last step."""
        log, val_set = tr.log, self.val_set
        self.ddp.train()
        step = tr.start
        window = MetricWindow(self.env)
        while step < cfg.max_steps:
            stats, lr = objective_step(tr, self.trainable, cfg, step + 1, self.to_device)
            step += 1
            window.add(stats)
            if cfg.log_due(step):
                log_objective_window(tr, cfg, step, window, lr, skipped_files=float(len(self.skips.all_paths())))
            if val_set is not None and cfg.val_due(step):
                log.log(step, self.validation(), prefix="val")
                self.ddp.train()
            if tr.checkpoint_due(step):
                tr.save(step, extra={"draws": self.objective.draws})
        if val_set is not None and step > tr.start:
            log.log(step, self.validation(), prefix="val")
        return step

    def final_writer(self) -> Callable[[Path], None]:
        """What writes RUN/final: the model directory (with a sharded model, its whole state dict is gathered
        to rank 0 first: every rank calls this)."""
        args, model = self.args, self.model
        whole = None
        if sharding.is_sharded(self.ddp):
            whole = sharding.strip_prefix(sharding.full_state_dict(self.ddp), "model.")

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
    """The run's first lines: ``intro``; on a fresh run the model's initialisation (and, from a VAR
    checkpoint, RUN/init_summary.json and its log record)."""
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


def prepare_model(model: StyleVAR, args: argparse.Namespace, env: DistEnv) -> None:
    """The model on the device in train mode, with the step's layouts: the convolutions NHWC on the CPU (not
    under FSDP), the blocks compiled with --compile."""
    model.activation_checkpointing = args.activation_checkpointing
    model.to(env.device).train()
    if env.device.type == "cpu" and args.strategy != "fsdp":
        channels_last(model)
    if args.compile:
        compile_blocks(model)


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
    fsdp = args.strategy == "fsdp"
    prepare_model(model, args, env)
    cache = open_cache(args, train_set, model, env)
    objective = SFTObjective(model, label_smoothing=args.label_smoothing, alpha_jitter=args.alpha_jitter,
                             seed=args.seed, scale_gamma=args.scale_gamma)
    ddp = sharding.shard_model(objective, model, env, precision) if fsdp else wrap_ddp(objective, env)
    # AdamW's fused kernel, on the CPU too (FSDP's sharded parameters: torch's own choice)
    optimizer = make_adamw(model, args.lr, args.weight_decay, betas=(0.9, 0.95), fused=None if fsdp else True)
    sched = ScheduleConfig(max_steps=args.max_steps, warmup_steps=args.warmup_steps, drop_step=args.lr_drop_step,
                           drop_fraction=args.lr_drop_fraction, drop_factor=args.lr_drop_factor)
    scheduler = two_level_scheduler(optimizer, sched)
    stream = make_stream(train_set, BatchStreamConfig(global_batch=args.batch_size, grad_accum=args.grad_accum,
                                                      seed=args.seed, num_workers=args.num_workers,
                                                      collate_fn=collate_triplets,
                                                      pin_memory=env.device.type == "cuda"), env)
    job = SFTRun(args, env, precision, model, objective, ddp, val_set, SkipTracker(env), cache)
    state = TrainingState(ddp, optimizer, scheduler, stream, env, scaler=make_grad_scaler(precision, env.device),
                          sharded=fsdp)
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
        if cache is not None:
            tr.log.info(cache.describe())
        step = job.steps(tr, cfg)
        tr.finish(step, job.final_writer())
    job.skips.report(run, {**getattr(train_set, "skipped", {}), **(getattr(val_set, "skipped", {}) or {})})
    return 0

if __name__ == "__main__":
    sys.exit(main())
