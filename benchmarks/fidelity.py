"""Content fidelity experiments: how much of the content's shapes survives each stage, variant by variant.

Three commands:

    python -m benchmarks.fidelity ceiling --tokenizer DIR [--n 96]
        The ceilings before any transformer: the synthetic target rule's edge correlation with the
        content, and the tokenizer's (its reconstruction of the content and of the target). A
        transformer cannot keep more of the content than its tokenizer's reconstruction does.

    python -m benchmarks.fidelity compare --data MANIFEST --tokenizer DIR --out DIR --steps N \
            [--variant NAME[=JSON]] ... [--jobs 2] [--n 48]
        Trains one SFT run per variant (python -m training.sft, same data, tokenizer, seed, steps and
        batch: the same CPU budget; re-running resumes or skips finished runs), then scores every
        variant and the baselines (copy-content, Reinhard) on held-out pairs from a synthesis seed the
        training data never uses and on real photographs. Writes OUT/results.json, OUT/table.md (the
        table, side by side) and OUT/grid_<variant>.png (content, style, target, two seeds, Reinhard).
        A variant is a name and a JSON object of transformer config overrides on the preset's
        transformer; the defaults are `published` ({}) and `injection` ({"content_injection": true}).
        Each variant is scored under every `--sampling TOP_K,TOP_P` given (default 20,0.8 and 1,0:
        sampled and greedy), one table row each.

    python -m benchmarks.fidelity curve --run RUN [--steps 300,600,...] [--n 48] [--out CURVE.json]
        The training-length curve of one SFT run (`training.sft --keep-checkpoints` large enough to keep
        them): every kept checkpoint (or the given steps) is loaded into the run's transformer and scored,
        without refinement, sampled (top-k 5, top-p 0.7) on held-out pairs and photographs: edge
        correlation, colour distance and the style measures against the step, one table row per step.

Metrics are `training.parts.demo_export.scorer`: edge correlation with the content at the model's resolution
(`stylevar.metrics.structure`), SSIM to the target (paper and standard), L1, the colour distance to the
style, and the seed spread (how much two seeds' outputs differ).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from stylevar.utils.helptext import HelpFormatter, RawDescriptionHelpFormatter


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fidelity", description=__doc__,
                                formatter_class=RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("ceiling", help="target-rule and tokenizer ceilings", formatter_class=HelpFormatter)
    c.add_argument("--tokenizer", type=Path, required=True, help="a tokenizer or model directory")
    c.add_argument("--n", type=int, default=96, help="held-out triplets")
    r = sub.add_parser("compare", help="train variants on one budget and score them side by side",
                       formatter_class=HelpFormatter)
    r.add_argument("--data", type=Path, required=True, help="synthetic triplet manifest")
    r.add_argument("--tokenizer", type=Path, required=True, help="the tokenizer folder every variant uses")
    r.add_argument("--out", type=Path, required=True, help="folder for the runs, results.json, table.md and grids")
    r.add_argument("--steps", type=int, default=400, help="SFT steps per variant")
    r.add_argument("--batch-size", type=int, default=16, help="SFT batch size")
    r.add_argument("--variant", action="append", metavar="NAME[=JSON]",
                   help="a variant: a name and transformer config overrides (repeat; default: published, injection)")
    r.add_argument("--jobs", type=int, default=1, help="variants trained at once")
    r.add_argument("--threads", type=int, default=1, help="threads per training run")
    r.add_argument("--n", type=int, default=48, help="held-out synthetic pairs")
    r.add_argument("--seed", type=int, default=0, help="training seed of every variant")
    r.add_argument("--sampling", action="append", metavar="TOP_K,TOP_P", help="a sampling every variant is scored under (repeat; default: 20,0.8 and 1,0)")
    k = sub.add_parser("curve", help="score the kept checkpoints of one SFT run against the step",
                       formatter_class=HelpFormatter)
    k.add_argument("--run", type=Path, required=True, help="a training.sft RUN directory")
    k.add_argument("--steps", type=lambda t: [int(x) for x in t.split(",")], help="the checkpoints' steps, comma-separated (default: every kept one)")
    k.add_argument("--n", type=int, default=48, help="held-out synthetic pairs")
    k.add_argument("--out", type=Path, help="also write the results here (JSON)")
    args = p.parse_args(argv)
    # torch: once the options are parsed
    from benchmarks.measures.fidelity import ceiling, compare, curve, curve_markdown, table_markdown

    if args.command == "curve":
        result = curve(args.run, args.steps, args.n)
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))
        print(curve_markdown(result))
        return 0
    if args.command == "ceiling":
        print(json.dumps(ceiling(args.tokenizer, args.n), indent=1))
        return 0
    print(table_markdown(compare(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
