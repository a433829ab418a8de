"""Supervised fine-tuning of StyleVAR on (content, style, target) triplets: ``python -m training.sft``.

    python -m training.sft --data MANIFEST_OR_SHARDS [--data ...] --preset tiny|d16|d20 --tokenizer DIR_OR_PTH \
        --out RUN --max-steps N --batch-size B [--grad-accum K] [--init-var VAR.pth | --init MODEL_DIR_OR_PTH]
    torchrun --nproc_per_node G -m training.sft ...          # the same run on G processes (--strategy fsdp: sharded)

Teacher-forced cross-entropy over the target's tokens with label smoothing, AdamW and the paper's two-level lr
after a warm-up. ``RUN/final/`` is a model directory (``StylePipeline.from_pretrained(RUN/final)``)."""
from __future__ import annotations

import argparse
import sys

from stylevar.loaders import hub
from training.parts.cli import SFT_COMPILE_MIN_STEPS, add_loop_args, recipe_parser, run_recipe


def build_parser() -> argparse.ArgumentParser:
    p = recipe_parser("training.sft", __doc__)
    p.add_argument("--preset", default="tiny", help="tiny|d16|d20|d24|d30 or a JSON preset file")
    p.add_argument("--tokenizer", required=True,
                   help="tokenizer folder (training.vqvae RUN/final or a model dir) or weights file (.pth/.safetensors)")
    init = p.add_mutually_exclusive_group()
    init.add_argument("--init-var", metavar="PTH", help="initialise from a class-conditional VAR checkpoint")
    init.add_argument("--init", metavar="DIR_OR_PTH",
                      help=f"initialise from StyleVAR weights (model dir, checkpoint, or hub id {hub.ID_FORM})")
    p.add_argument("--image-size", type=int, default=None, help="image side in pixels (default: the tokenizer's)")
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
    p.add_argument("--augment-palette", action="store_true",
                   help="also give the style and the target one random RGB channel order (the same for both), with "
                        "or without --no-augment's plain crops (training.parts.data); no token cache with it")
    p.add_argument("--val-batch-size", type=int, default=32, help="triplets per validation batch")
    p.add_argument("--val-max-batches", type=int, default=0, help="cap on validation batches per rank (0: all)")
    p.add_argument("--name", default="stylevar-sft", help="model name written to RUN/final/config.json")
    p.add_argument("--drop-path-rate", type=float, default=None,
                   help="stochastic depth: block i drops its branches with probability linspace(0, rate, depth)[i] "
                        "(default: the model's config; the published presets 0.1 * depth / 24, tiny 0)")
    p.add_argument("--token-cache", action=argparse.BooleanOptionalAction, default=None,
                   help="encode every training triplet with the frozen tokenizer once and read the token maps "
                        "back in later epochs and runs (stored beside the data; see training.parts.token_cache). "
                        "Default: on with --no-augment, manifest data and more than one epoch of steps, and "
                        "where the data's folder is writable; off with augmentation (augmented images, and so "
                        "their tokens, differ every epoch)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile each transformer block (the same result to float rounding; the first "
                        "step compiles for tens of seconds). Default: on for runs of at least "
                        f"{SFT_COMPILE_MIN_STEPS} steps where a compiler is found (a C++ compiler on the CPU, Triton "
                        "on CUDA), not with --strategy fsdp; --no-compile: eager")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="recompute block activations in the backward pass (less memory, same result)")
    p.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp",
                   help="ddp: every process holds the whole model, gradients and optimizer state; fsdp: all three "
                        "sharded over the processes (FSDP2, sharded checkpoints; see training.parts.fsdp)")
    add_loop_args(p, lr=5e-4, batch_size=32, max_grad_norm=2.0)
    return p


def main(argv: list[str] | None = None) -> int:
    return run_recipe(build_parser(), "training.sft.run", argv)


if __name__ == "__main__":
    sys.exit(main())
