"""A model beside the teacher on real photographs x real styles (`stylevar.evaluate.real_pairs`).

`--photos` / `--art` pick pictures by parts of their file names (default: all in the folder). Writes
PREFIX.json (means per method, per-pair wins against the teacher), PREFIX.md (the table) and PREFIX.png
(rows of content, style, teacher, model, transformer alone, Reinhard).
"""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks.harness import command_parser
from stylevar.utils.precision import PRECISIONS  # no torch


def main(argv: list[str] | None = None) -> int:
    p = command_parser("benchmarks.real_pairs", __doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model directory (default: the demo model)")
    p.add_argument("--contents", type=Path, required=True, help="folder of content photographs")
    p.add_argument("--styles", type=Path, required=True, help="folder of style pictures")
    p.add_argument("--photos", default=None, help="comma-separated parts of file names (default: all)")
    p.add_argument("--art", default=None, help="comma-separated parts of style file names (default: all)")
    p.add_argument("--max-side", type=int, default=1024, help="long side the photographs are shrunk to, at most")
    p.add_argument("--seed", type=int, default=0, help="seed of the model's sampling")
    p.add_argument("--grid-rows", type=int, default=8, help="pairs shown in PREFIX.png")
    p.add_argument("--precision", choices=("plain", *PRECISIONS), default="plain",
                   help="the model as loaded (plain), or prepared as the service runs it at this precision "
                        "(stylevar.runtime.inference)")
    p.add_argument("--out", type=Path, default=None, help="PREFIX for .json, .md and .png")
    a = p.parse_args(argv)
    from stylevar.evaluate.real_pairs import RealPairs, evaluate, markdown  # torch: once the options are parsed
    from stylevar.pipelines.pipeline import StylePipeline
    spec = RealPairs.from_folders(a.contents, a.styles, a.photos, a.art, a.max_side)
    pipe = StylePipeline.from_pretrained(a.model, device="cpu")
    if a.precision != "plain":
        from stylevar.runtime.inference import InferenceConfig, prepare

        prepare(pipe.model, InferenceConfig(precision=a.precision))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
    result = evaluate(pipe, spec, a.seed, a.out.with_suffix(".png") if a.out else None, a.grid_rows)
    table = markdown(result)
    print(table)
    if "model_better_than_teacher" in result:
        print(f"model better than the teacher in {result['model_better_than_teacher']} of {result['n_pairs']} pairs")
    if a.out:
        a.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        a.out.with_suffix(".md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
