"""Full-size results: bicubic against content-guided upsampling (`stylevar.processing.upsample`), measured at the
size a user gets back.

    python -m benchmarks.upsample quality [--n 48] [--sizes 512,2048] [--out benchmarks/results/upsample.json]
        The demo model on held-out synthetic pairs (contents synthesised at the output size, so they have
        detail there; styles at the model's size) and the four bundled photographs (resized with Lanczos
        to the output size): edge correlation with the content, the distance of the mean colour to the
        style's and the sliced Wasserstein colour distance to the style (`stylevar.metrics.style_fidelity`,
        on every k-th pixel of each axis so that about 256 remain: the same distribution, fewer points),
        all at the returned size; rows: bicubic, guided, Reinhard (computed at the output size). The
        model draws once per pair (seed 0); the two upsamplings start from the same drawing.

    python -m benchmarks.upsample cost [--megapixels 2,12,24] [--repeats 3]
        Time and peak added memory of the upsampling step alone (`upscale`: bicubic, Pillow's resize; guided,
        the strips of the drawing and the detail) for a 3:2 content of each size: each size and mode in a
        fresh process, peak RSS (VmHWM) minus the RSS just before the step.

    python -m benchmarks.upsample detail --contents DIR --styles DIR [--photos A,B] [--art C,D] [--model DIR]
                                         [--variants 1:1e-3:2,2:1e-3:2] [--out JSON]
        The guided step's settings (strength:eps:radius) side by side on real photographs x paintings,
        returned at the content's size and scored at 256 px with the real-pairs measures (sharpness and the
        pretrained style measures among them); the model draws each pair once per variant with the same seed.
        The demo's strength 2 was chosen on training pictures with it, then checked on the held-out judges.

    python -m benchmarks.upsample grid --out docs/upsample_crop.png
        A before/after crop at full size (bicubic | guided | the content) for the README and docs/ui.md.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stylevar.utils.helptext import HelpFormatter, RawDescriptionHelpFormatter


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.upsample", description=__doc__,
                                formatter_class=RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    q = sub.add_parser("quality", help="edge correlation and colour at the returned size",
                       formatter_class=HelpFormatter)
    q.add_argument("--n", type=int, default=48, help="held-out synthetic pairs")
    q.add_argument("--sizes", default="512,2048", help="long sides of the results, comma-separated")
    q.add_argument("--out", type=Path, help="also write the results here (JSON)")
    c = sub.add_parser("cost", help="time and peak added memory of the upsampling step",
                       formatter_class=HelpFormatter)
    c.add_argument("--megapixels", default="2,12,24", help="content sizes, comma-separated")
    c.add_argument("--repeats", type=int, default=3, help="timed calls per size and mode")
    d = sub.add_parser("detail", help="the guided step's strength, eps and radius on real pairs",
                       formatter_class=HelpFormatter)
    d.add_argument("--contents", type=Path, required=True, help="folder of photographs")
    d.add_argument("--styles", type=Path, required=True, help="folder of style pictures")
    d.add_argument("--photos", default=None, help="comma-separated parts of the photographs' names (default: all)")
    d.add_argument("--art", default=None, help="comma-separated parts of the styles' names (default: all)")
    d.add_argument("--model", default=None, help="model directory (default: the demo model)")
    d.add_argument("--variants", default="1:1e-3:2,1.5:1e-3:2,2:1e-3:2,1:1e-4:2,1.5:1e-4:2",
                   help="strength:eps:radius of each variant, comma-separated")
    d.add_argument("--out", type=Path, help="also write the results here (JSON)")
    g = sub.add_parser("grid", help="a before/after crop at full size", formatter_class=HelpFormatter)
    g.add_argument("--out", type=Path, required=True, help="PNG to write")
    once = sub.add_parser("_cost", help="one measurement in this process (what `cost` runs in a fresh one)",
                          formatter_class=HelpFormatter)
    once.add_argument("mp", type=float, help="content megapixels")
    once.add_argument("mode", help="guided or bicubic")
    once.add_argument("repeats", type=int, help="timed calls")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # torch: once the options are parsed
    from benchmarks.measures.upsample import (cost, cost_markdown, cost_once, crop_grid, detail, detail_markdown,
                                              quality, quality_markdown)

    if args.command == "quality":
        result = quality(args.n, [int(s) for s in args.sizes.split(",")])
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))
        print(quality_markdown(result))
    elif args.command == "cost":
        print(cost_markdown(cost([float(x) for x in args.megapixels.split(",")], args.repeats)))
    elif args.command == "detail":
        result = detail(args)
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))
        print(detail_markdown(result))
    elif args.command == "grid":
        print(crop_grid(args.out))
    else:
        print(json.dumps(cost_once(args.mp, args.mode, args.repeats)))
    return 0



if __name__ == "__main__":
    sys.exit(main())
