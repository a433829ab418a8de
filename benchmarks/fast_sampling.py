"""Fast sampling's quality on the demo model: the full sampler and fast sampling side by side.

    python -m benchmarks.fast_sampling [--model DIR] [--n 48] [--seed 0] [--keep F ...] [--min-tokens N] [--json]

The model (default: the embedded demo model, its default pipeline: recommended top-k / top-p, palette step,
refinement) stylizes held-out synthetic pairs (`training.parts.demo_export.heldout_triplets`, a synthesis seed the demo's
training never used) and the four bundled photographs with synthetic styles (`training.parts.demo_export.photo_triplets`),
sample i with seed + i, once with the full sampler and once per `--keep` with fast sampling
(`stylevar.models.transformer.pruning.FastSampling`: the fraction of the 2 x 2 groups of every scale of at least
`--min-tokens` positions computed position by position; without `--keep`, the model's own plan). Per row, the means of
`training.parts.demo_export.scorer`'s measures (`training.parts.demo_export.generate`, as the demo's evaluation): edge correlation with
the content, the distance of the mean colour to the style's, the colour and texture measures of
`stylevar.metrics.style_fidelity`; the token agreement with the full sampler (same inputs and seeds) over all
tokens and over the merged scales' tokens, and whether every coarser scale's tokens equal the full sampler's
("coarse = full"); for scale, the full sampler's own agreement between two seeds (seed + i and
seed + 1000 + i). Speed against the reference is `benchmarks.cpu_pipeline --fast`'s.
"""
from __future__ import annotations

import argparse
import json
import sys

from stylevar.utils.helptext import HelpFormatter


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fast_sampling", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--model", default=None, help="model directory (default: the embedded demo model)")
    p.add_argument("--n", type=int, default=48, help="held-out synthetic pairs")
    p.add_argument("--seed", type=int, default=0, help="sample i uses seed + i")
    p.add_argument("--keep", action="append", type=float, default=None,
                   help="a fraction of the 2 x 2 groups computed position by position (repeatable: one row each; "
                        "default: the model's own plan)")
    p.add_argument("--min-tokens", type=int, default=None,
                   help="the smallest scale (in positions) that fast sampling merges (default: FastSampling's)")
    p.add_argument("--threads", type=int, default=2, help="torch's CPU threads")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    a = p.parse_args(argv)
    from benchmarks.measures.fast_sampling import measure, table_markdown  # torch: once the options are parsed

    out = measure(a)
    if a.json:
        print(json.dumps(out))
        return 0
    print(f"{out['model']}: {a.n} held-out synthetic pairs and 4 photographs, seed {a.seed}, {a.threads} threads, "
          f"load {out['load']:.2f} -> {out['load_after']:.2f}", file=sys.stderr)
    for part in ("synthetic", "photos"):
        print(f"\n{part}\n" + table_markdown(out[part]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
