"""CPU inference, stage by stage, on the reference-shaped configuration.

The configuration, written in the reference's config.json fields (`REFERENCE_CONFIG`): VAR's tokenizer
layout (ch_mult (1, 1, 2, 2, 4), downsampling 16) at base width ch 32 as in the reference's golden_small
config, V = 4096, Cvae 32, 8 scales (1, 2, 3, 4, 5, 6, 8, 10) = 255 tokens at 160 px, and a depth-8
StyleVAR (width 512, 8 heads) with ResNet-18 image encoders; random weights. (The issue does not state the
tokenizer width; ch 32 is the one its stage times fit: 3.4 GFLOP per encode, 6.2 per decode, against 84 and
154 at the published ch 160.)

    python -m benchmarks.cpu_pipeline [--batch-sizes 1,4] [--repeats 7] [--warmup 2] [--threads 2] \
        [--precisions fp32,bf16] [--reference] [--agreement-seeds 8] [--fast [--fast-keep F] [--fast-min-tokens N]] [--json]

Per batch size it prints, for the plain model (as built: the path the conformance tests check) and a
prepared copy per `--precisions` entry (`stylevar.runtime.inference.prepare`), the median ms per image of each stage
and of the whole `generate` call:
  encode    two VQ-VAE encodes (content and style: encoder, quant_conv, multi-scale quantisation)
  encoders  the two ResNet-18 image encoders (pooled)
  condition everything `StyleVAR.condition` does (the two rows above plus the token embeddings)
  loop      `StyleVAR.sample_tokens` (the coarse-to-fine transformer loop, top-k 900 / top-p 0.96)
  decode    the final VQ-VAE decode
  total     `StyleVAR.generate` end to end (what a caller waits for)
Each stage is timed with the models' calls taking turns in one process (same inputs), so a shared
machine's changing load weighs on each alike; stages are separate medians, so `condition + loop + decode`
is close to, not equal to, `total`. For bf16 it also prints the token agreement with the plain fp32 model
(same inputs and seeds, `--agreement-seeds` images). (int8 was removed: stylevar.utils.precision.)

`--fast` adds the row `fp32 fast`: the prepared fp32 model with fast sampling (`GenerationConfig.fast`,
`stylevar.models.transformer.pruning`: the flat 2 x 2 groups of the last scales merged) in its loop and total, with
the model's plan or `--fast-keep` / `--fast-min-tokens`; its token agreement with the plain model
is printed too (random weights: what it says about quality is benchmarks/fast_sampling.py's on the demo model).

`--reference` also times the public reference implementation (`benchmarks.reference_pipeline`; a checkout
of it on PYTHONPATH, nothing vendored) in the same turns, at identical weights: this project's models are
then loaded from the reference's own random state dicts through this project's checkpoint loaders, and the
greedy images of the two are compared (they agree to float rounding). Its loop is its total less its other
stages. Without `--reference` the ratio printed is to the issue's side-by-side measurement on an idle
machine (the reference at 1.40x this project's plain time at batch 1, 1.49x at batch 4, as then).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from benchmarks.side_by_side import timing_arguments
from stylevar.utils.helptext import HelpFormatter
from stylevar.utils.threads import apply_threads  # no torch

if TYPE_CHECKING:
    from benchmarks.measures.cpu_pipeline import StageBenchConfig


def parse_config(argv: list[str] | None) -> tuple[StageBenchConfig, bool]:
    """The command line as a `StageBenchConfig`, and whether to print JSON."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.cpu_pipeline", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    timing_arguments(p, repeats=7, warmup=2)
    p.add_argument("--precisions", default="fp32",
                   help="comma-separated prepared models to time beside the plain one: fp32, bf16")
    p.add_argument("--reference", action="store_true",
                   help="also time the public reference (a checkout of it on PYTHONPATH), at identical weights")
    p.add_argument("--agreement-seeds", type=int, default=8,
                   help="images whose tokens are compared with the fp32 model's (same seeds)")
    p.add_argument("--fast", action="store_true", help="also time the prepared fp32 model with fast sampling")
    p.add_argument("--fast-keep", type=float, default=None, metavar="F",
                   help="fast sampling's fraction of 2 x 2 groups computed one by one (default: the model's plan's)")
    p.add_argument("--fast-min-tokens", type=int, default=None, metavar="N",
                   help="fast sampling's smallest merged scale, in positions (default: the model's plan's)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    a = p.parse_args(argv)
    from stylevar.utils.precision import precision_error

    precisions = tuple(x for x in a.precisions.split(",") if x)
    for x in precisions:
        if precision_error(x):  # a removed one (int8) says why
            p.error(f"--precisions: {precision_error(x)}")
    from benchmarks.measures.cpu_pipeline import StageBenchConfig  # torch: once the options are checked

    cfg = StageBenchConfig(batch_sizes=tuple(int(b) for b in a.batch_sizes.split(",")), repeats=a.repeats,
                           warmup=a.warmup, threads=a.threads, precisions=precisions, reference=a.reference,
                           agreement_seeds=a.agreement_seeds,
                           fast=a.fast or a.fast_keep is not None or a.fast_min_tokens is not None,
                           fast_keep=a.fast_keep, fast_min_tokens=a.fast_min_tokens)
    return cfg, a.json


def main(argv: list[str] | None = None) -> int:
    cfg, as_json = parse_config(argv)
    from benchmarks.measures.cpu_pipeline import measure, print_report

    apply_threads(cfg.threads)
    reference = None
    if cfg.reference:
        from benchmarks.measures.reference_pipeline import ReferenceMissing, build_reference, missing_message

        try:
            reference = build_reference(cfg.seed)
        except ReferenceMissing as e:
            print(f"cpu_pipeline: {missing_message(e)}", file=sys.stderr)
            return 2
    out = measure(cfg, reference)
    if as_json:
        print(json.dumps(out))
    else:
        print_report(out, cfg)
    return 0



if __name__ == "__main__":
    raise SystemExit(main())
