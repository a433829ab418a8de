"""Evaluate a trained model against weight-free baselines and export it as the embedded demo model.

    python -m training.demo --model RUN/final --data MANIFEST --out stylevar/assets/demo \
        [--timings TIMINGS.json] [--n 64] [--seed 0] [--real-contents DIR --real-styles DIR]

Sampling settings, refinement and palette step are chosen on training triplets; the model is evaluated on
held-out triplets and photographs beside copy-content and Reinhard, and saved (float16 where that changes the
evaluation by less than 0.002 SSIM) with a model card (``training.demo.export``, ``training.demo.card``)."""
from __future__ import annotations

import argparse
from pathlib import Path

from stylevar.cli.command import Parser
from stylevar.utils.helptext import plain
from training.parts.cli import run_recipe


def palette_choice(text: str) -> tuple[str, float]:
    """``distribution:1`` -> ("distribution", 1.0); the method is moments or distribution, the strength in (0, 1]."""
    method, _, strength = text.partition(":")
    try:
        value = float(strength) if strength else 1.0
    except ValueError:
        value = float("nan")
    if method not in ("moments", "distribution") or not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected moments:S or distribution:S with S in (0, 1]")
    return method, value


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m training.demo", description=plain(__doc__))
    p.add_argument("--model", required=True, type=Path, help="trained model directory (RUN/final)")
    p.add_argument("--data", required=True, type=Path, help="the training manifest (sampling is chosen on it)")
    p.add_argument("--out", required=True, type=Path,
                   help="where to write the demo model directory (a card already there keeps all but its generated "
                        "blocks: training.demo.card)")
    p.add_argument("--timings", type=Path, help="JSON with the training stages' times and commands")
    p.add_argument("--experiments", type=Path, help="markdown table from benchmarks/fidelity.py for the card")
    p.add_argument("--n", type=int, default=48, help="held-out synthetic triplets")
    p.add_argument("--calibration", type=int, default=32,
                   help="training triplets that choose the sampling settings, the refinement and the palette step")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of the evaluation (the held-out pairs have their own)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--real-contents", type=Path, help="folder of held-out real photographs (the real-pairs evaluation)")
    p.add_argument("--real-styles", type=Path, help="folder of held-out real styles")
    p.add_argument("--real-photos", default=None, help="parts of file names picking the photographs (default: all)")
    p.add_argument("--real-art", default=None, help="parts of file names picking the styles (default: all)")
    p.add_argument("--ceiling", type=Path, help="JSON of the teacher's ceiling rows ({\"rows\": [...]}) for the card's ceiling table")
    p.add_argument("--palette", default=None, metavar="METHOD:STRENGTH", type=palette_choice,
                   help="the palette step to ship, e.g. distribution:1 (default: chosen on the calibration triplets; "
                        "the card shows every candidate either way)")
    p.add_argument("--upsample-strength", type=float, default=None, metavar="S",
                   help="the guided upsampling's strength to ship, in [0, 2] (default: the library's, 1); chosen "
                        "with `benchmarks.upsample detail` on training pictures")
    p.add_argument("--compare", action="append", default=[], metavar="NAME=JSON",
                   help="another model's benchmarks/real_pairs.py JSON, a row of the card's variants table")
    return p


def main(argv: list[str] | None = None) -> int:
    return run_recipe(build_parser(), "training.demo.export", argv, entry="export", extra=None)  # reads, trains not


if __name__ == "__main__":
    raise SystemExit(main())
