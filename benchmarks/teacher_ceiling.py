"""Ceilings of learning from the teacher, before any transformer: what survives each stage at 256 px.

    python -m benchmarks.teacher_ceiling --contents DIR --styles DIR [--tokenizer DIR ...] [--n 24] [--out JSON]

Pairs are made as `data_tools.teach` makes them (seed 777, not the training data's), the teacher painting
each content crop at 384 px. Every row is scored at 256 px against the 256 px content and style with the
project's measures (edge correlation with the content, colour SWD and texture distance to the style):

- copy-content, Reinhard, the teacher at 256 px (what a perfect student would return at full size);
- the teacher shrunk to S px (S = 64, 128) and brought back to 256 px, bicubic or content-guided
  (`stylevar.processing.upsample`, the pipeline's default): the ceiling of any model drawing S px;
- each `--tokenizer`'s reconstruction of the teacher's S px target (S its own size), guided to 256 px:
  the ceiling of a transformer over that tokenizer.
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
    p.add_argument("--tokenizer", type=Path, action="append", help="a tokenizer folder or model directory (repeat)")
    p.add_argument("--n", type=int, default=24, help="pairs made and scored")
    p.add_argument("--out", type=Path, default=None, help="also write the rows here (JSON)")
    a = p.parse_args(argv)
    from benchmarks.measures.teacher_ceiling import ceilings  # torch: once the options are parsed
    from stylevar.evaluate.real_pairs import ceiling_markdown

    rows = ceilings(a)
    print(ceiling_markdown(rows))
    if a.out:
        a.out.write_text(json.dumps({"n": a.n, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
