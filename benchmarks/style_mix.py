"""Several styles, masks and guidance on a model: the measurements behind docs/ui.md.

    python -m benchmarks.style_mix [--model DIR] [--n 8] [--seeds 3] [--out benchmarks/results/style_mix]
                                   [--figures docs]

Inputs: `--n` held-out synthetic pairs (a synthesis seed no training data uses) and the four bundled
photographs, each content with style A = its own pair's style and style B = the next pair's style
(`training.parts.demo_export.heldout_triplets`, `photo_triplets`). Every number is a mean over the contents and
`--seeds` seeds, computed at the model's resolution; "colour distance" is the distance between mean
RGB colours in [0, 1] (`training.parts.demo_export.scorer`'s colour_dist_to_style), "edge correlation" is
`stylevar.metrics.structure.edge_correlation` with the content (content fidelity).

Three measurements:
  mask      style A confined to one half of the picture (white), the content alone on the other; both
            halves in turn, so the content's own left/right difference cancels. Colour distance to A's
            mean colour inside the painted half and outside it (and, for reference, in the same halves of
            the unmasked result). Then A and B on complementary halves: distance to A in A's half and in B's.
  weights   A and B blended with weights (w, 1 - w), w = 0 .. 1: the position of the output's mean colour
            along the line from B's mean colour (0) to A's (1), and its distance to each.
  guidance  guidance g = 0, 0.25, 0.5, 1, 2 with style A: colour distance to A (lower = more style), edge
            correlation with the content and SSIM to the content (lower = less content fidelity).

Writes OUT.json (every number) and OUT.md (the tables); with --figures, figures of one example each
(style_mix_blend.png, style_mix_mask.png, style_mix_guidance.png) made by the model.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stylevar.utils.helptext import HelpFormatter

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.style_mix", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--model", default=None, help="model directory (default: the embedded demo model)")
    p.add_argument("--n", type=int, default=8, help="held-out synthetic pairs (plus the four photographs)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per content")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "style_mix"), help="writes OUT.json and OUT.md")
    p.add_argument("--figures", default=None, help="folder for the example figures (e.g. docs)")
    p.add_argument("--figure-case", type=int, default=0, help="which content the figures show")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ...")
    p.add_argument("--figures-only", action="store_true", help="make the figures (--figures), measure nothing")
    args = p.parse_args(argv)
    if args.figures_only and not args.figures:
        p.error("--figures-only needs --figures DIR")
    from benchmarks.measures.style_mix import execute  # torch: once the options are parsed
    from stylevar.utils.precision import set_matmul_precision

    set_matmul_precision()  # TF32 on CUDA

    return execute(args)


if __name__ == "__main__":
    sys.exit(main())
