"""Ceilings of learning from the teacher, before any transformer: what survives each stage.

    python -m benchmarks.teacher_ceiling --contents DIR --styles DIR [--photos A,B] [--art C,D] [--tokenizer DIR ...]
                                         [--max-side 1024] [--out JSON]

Every photograph (long side capped at --max-side) is painted by the teacher with every style, at the
photograph's size. Every row is brought to the photograph's size and scored at 256 px against it and the style
with the real-pairs measures (`stylevar.evaluate.real_pairs`: edge correlation, colour SWD, texture distance,
sharpness, and the pretrained style-vector cosine and Gram distance):

- copy-content, Reinhard, the teacher at full size (what a perfect student would return);
- the teacher's picture at N px (N = 64, 128, 256, the pipeline's square fit), brought back bicubic or
  content-guided (`stylevar.processing.upsample`, the pipeline's default): the ceiling of any model drawing N px;
- the teacher's picture at each `--tokenizer`'s size, encoded and decoded by it, guided: the ceiling of a
  transformer over that tokenizer.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from stylevar.utils.helptext import HelpFormatter


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.teacher_ceiling", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--contents", type=Path, required=True, help="folder of content photographs")
    p.add_argument("--styles", type=Path, required=True, help="folder of style pictures")
    p.add_argument("--photos", default=None, help="comma-separated parts of the photographs' names (default: all)")
    p.add_argument("--art", default=None, help="comma-separated parts of the styles' names (default: all)")
    p.add_argument("--tokenizer", type=Path, action="append", help="a tokenizer folder or model directory (repeat)")
    p.add_argument("--max-side", type=int, default=1024, help="the photographs' long side is capped at this")
    p.add_argument("--out", type=Path, default=None, help="also write the rows here (JSON)")
    a = p.parse_args(argv)
    from benchmarks.measures.teacher_ceiling import ceilings  # torch: once the options are parsed
    from stylevar.evaluate.real_pairs import ceiling_markdown

    rows = ceilings(a)
    print(ceiling_markdown(rows))
    if a.out:
        a.out.write_text(json.dumps({"contents": str(a.contents), "styles": str(a.styles), "photos": a.photos,
                                     "art": a.art, "max_side": a.max_side, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
