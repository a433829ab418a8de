"""`stylevar evaluate`: methods side by side on benchmark triplets (stylevar.evaluate); sharded over N
processes: ``torchrun --nproc-per-node N -m stylevar.evaluate ARGS``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stylevar.cli.command import EXIT_USAGE, Command
from stylevar.loaders import hub  # no torch
from stylevar.utils.helptext import DEVICE_AUTO

EXIT_MISSING_WEIGHTS = 3


def _parse_benchmark(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=MANIFEST_OR_ROOT, got {text!r}")
    return name, path


def run(args: argparse.Namespace) -> int:
    from stylevar.utils.extras import extra_error
    if error := extra_error("metrics", "evaluation"):  # found now, not after the methods ran (charts need matplotlib)
        print(f"stylevar evaluate: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    from stylevar.baselines.magenta import TeacherUnavailable
    from stylevar.evaluate.config import MISSING, EvalConfig
    from stylevar.evaluate import runner
    from stylevar.metrics.definitions import NAMES
    from stylevar.utils.precision import set_matmul_precision
    metrics = tuple(NAMES) if args.metrics == ["all"] else tuple(args.metrics)
    cfg = EvalConfig(
        methods=tuple(args.method), benchmarks=tuple(args.benchmark), out=args.out, n=args.n, seed=args.seed,
        metrics=metrics, split=args.split, device=args.device, allow_missing=args.allow_missing,
        batch_size=args.batch_size, lpips_net=args.lpips_net, image_size=args.image_size,
        grid_rows=args.grid_rows, warmup=not args.no_warmup, progress=not args.quiet,
    )
    set_matmul_precision()  # stylevar.utils.precision: TF32 on CUDA
    try:
        result = runner.run(cfg)
    except runner.MissingWeightsError as e:
        print(f"stylevar evaluate: {e}", file=sys.stderr)
        return EXIT_MISSING_WEIGHTS
    except TeacherUnavailable as e:  # `--method magenta` without its extra: bad input, found before the work
        print(f"stylevar evaluate: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if result.rank != 0:  # under torchrun process 0 reports
        return 0
    for k, w in result.skipped_metrics.items():
        print(f"note: {k} marked {MISSING} (weight {w} not present)", file=sys.stderr)
    for note in result.shortfalls:
        print(f"note: {note}", file=sys.stderr)
    print((Path(cfg.out) / "results.md").read_text(encoding="utf-8"))
    print("wrote " + ", ".join(str(p) for p in result.files), file=sys.stderr)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    import stylevar.evaluate
    from stylevar.evaluate.config import SPLITS
    from stylevar.metrics.definitions import NAMES, PAPER_METRICS
    p.description = stylevar.evaluate.__doc__.split("\n\n")[0]
    p.add_argument("--method", action="append", required=True,
                   metavar="MODEL_DIR|HUB_ID|adain|adain-paper|reinhard|magenta",
                   help=f"a method to evaluate (repeat for several); a hub id {hub.ID_FORM} is pulled on first "
                        "use")
    p.add_argument("--benchmark", action="append", required=True, type=_parse_benchmark,
                   metavar="NAME=MANIFEST_OR_ROOT", help="a triplet manifest, or a folder holding manifest.jsonl (repeat)")
    p.add_argument("--n", "--rows", type=int, default=50,
                   help="rows drawn per benchmark (under torchrun write --rows: it reads --n as its own)")
    p.add_argument("--seed", type=int, default=42, help="row drawing and generation seeds")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--metrics", nargs="+", default=list(PAPER_METRICS), metavar="METRIC",
                   help=f"'all' or any of {', '.join(NAMES)} (default: the paper's six)")
    p.add_argument("--split", choices=SPLITS, default="val", help="manifest split to draw from")
    p.add_argument("--allow-missing", action="store_true",
                   help="skip (and mark) metrics and methods whose weights are not present")
    p.add_argument("--device", default=None, help=f"cpu, cuda, cuda:1 ... (default: {DEVICE_AUTO})")
    p.add_argument("--batch-size", type=int, default=4, help="triplets per model call")
    p.add_argument("--lpips-net", choices=("vgg", "alex"), default="vgg", help="LPIPS backbone")
    p.add_argument("--image-size", type=int, default=256, help="evaluation resolution (the paper: 256)")
    p.add_argument("--grid-rows", type=int, default=4, help="samples shown in each samples_<benchmark>.png")
    p.add_argument("--no-warmup", action="store_true", help="time the first call too (default: one untimed call)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


COMMAND = Command("evaluate", "compare methods on benchmark triplets (the paper's Table 1 metrics)", add_arguments)
