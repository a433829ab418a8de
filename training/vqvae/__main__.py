"""Train the multi-scale VQ-VAE tokenizer: ``python -m training.vqvae``.

    python -m training.vqvae --data MANIFEST [--data ...] --preset tiny|FILE.json --out RUN --max-steps N \
        --batch-size B|auto [--lr 2e-4] [--image-size S] [--device cuda --max-minutes M]
    torchrun --nproc_per_node G -m training.vqvae ...      # the same run on G processes

Reconstruction (L1, L2, LPIPS when its weights are present, stroke losses when weighted) plus the VQ loss, with
dead-code restarts. ``RUN/final/`` is a tokenizer folder (``MultiScaleVQVAE.from_pretrained``, ``--tokenizer``)."""
from __future__ import annotations

import argparse
import sys

from training.parts.cli import add_loop_args, recipe_parser, run_recipe


def build_parser() -> argparse.ArgumentParser:
    p = recipe_parser("training.vqvae", __doc__,
                           data_help="triplet manifest (or folder holding manifest.jsonl); repeatable")
    p.add_argument("--preset", default="tiny", help="tiny|d16|d20|d24|d30 or a JSON preset file")
    p.add_argument("--image-size", type=int, default=None, help="train at this size (drops the finest scales)")
    p.add_argument("--init", default=None, metavar="DIR",
                   help="start from this tokenizer's weights (a model directory or RUN/final; same config, or the "
                        "same at space-to-channel 1: widened)")
    p.add_argument("--roles", default="content,style,target",
                   help="which images of each triplet train the tokenizer, comma-separated (teacher data: style,target)")
    p.add_argument("--l1-weight", type=float, default=1.0, help="weight of the L1 reconstruction loss")
    p.add_argument("--l2-weight", type=float, default=1.0, help="weight of the L2 reconstruction loss")
    p.add_argument("--vq-weight", type=float, default=1.0, help="weight of the codebook/commitment loss")
    p.add_argument("--lpips-weight", type=float, default=0.1, help="used when LPIPS weights are present")
    p.add_argument("--style-feature-weight", type=float, default=0.0,
                   help="weight of the perceptual loss on the teacher's style predictor's features (teacher extra)")
    p.add_argument("--gradient-weight", type=float, default=0.0,
                   help="weight of the L1 loss on the images' horizontal and vertical differences (edges, strokes)")
    p.add_argument("--restart-every", type=int, default=50, help="dead-code check every N steps (0: never)")
    p.add_argument("--dead-after", type=int, default=100, help="a code unused this many steps is dead")
    p.add_argument("--val-batch-size", type=int, default=32, help="images per validation batch")
    p.add_argument("--channels-last", action="store_true",
                   help="convolutions in NHWC (weights and images): faster on GPUs with tensor cores")
    add_loop_args(p, lr=2e-4, batch_size=32, max_grad_norm=1.0,
                  auto_batch="the largest power of two whose step fits in the GPU's free memory (CUDA; a resumed "
                             "run keeps its batch)")
    return p


def main(argv: list[str] | None = None) -> int:
    return run_recipe(build_parser(), "training.vqvae.run", argv)


if __name__ == "__main__":
    sys.exit(main())
