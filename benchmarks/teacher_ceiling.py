"""Ceilings of learning from the teacher, before any transformer: what survives each stage at 256 px.

    python benchmarks/teacher_ceiling.py --contents DIR --styles DIR [--tokenizer DIR ...] [--n 24] [--out JSON]

Pairs are made as `data_tools.teach` makes them (seed 777, not the training data's), the teacher painting
each content crop at 384 px. Every row is scored at 256 px against the 256 px content and style with the
project's measures (edge correlation with the content, colour SWD and texture distance to the style):

- copy-content, Reinhard, the teacher at 256 px (what a perfect student would return at full size);
- the teacher shrunk to S px (S = 64, 128) and brought back to 256 px, bicubic or content-guided
  (`stylevar.upsample`, the pipeline's default): the ceiling of any model drawing S px;
- each `--tokenizer`'s reconstruction of the teacher's S px target (S its own size), guided to 256 px:
  the ceiling of a transformer over that tokenizer.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from PIL import Image

from data_tools.teach import TeachConfig, Teacher
from stylevar.baselines.reinhard import reinhard_transfer
from stylevar.evaluate.real_pairs import SCORE_SIZE, ceiling_markdown, score as score_pairs, score_batch as batch
from stylevar.images import fit_square, pil_to_tensor, tensor_to_pil
from stylevar.upsample import Upsampling, upscale



def score(images: list[Image.Image], contents: torch.Tensor, styles: torch.Tensor) -> dict[str, float]:
    return {k: float(v.mean()) for k, v in score_pairs(images, contents, styles).items()}


def guided(drawing: Image.Image, content: Image.Image) -> Image.Image:
    """A square drawing at the model's size brought to the content's size as the pipeline does."""
    seen, fit = fit_square(content, drawing.width)
    return upscale(pil_to_tensor(drawing), pil_to_tensor(seen), fit, content, None, Upsampling(mode="guided"))


@torch.no_grad()
def reconstruct(tokenizer_dir: Path, images: list[Image.Image]) -> list[Image.Image]:
    from training.sft import read_tokenizer
    from stylevar.config import VQVAEConfig

    tok = read_tokenizer(str(tokenizer_dir), VQVAEConfig.preset("tiny"), None).eval()
    s = tok.cfg.image_size
    x = batch(images, s) * 2 - 1
    out = tok.decode_indices(tok.encode_indices(x)).add(1).mul(0.5).clamp(0, 1)
    return [tensor_to_pil(o) for o in out]


def ceilings(args: argparse.Namespace) -> dict[str, dict]:
    teacher = Teacher(TeachConfig(contents=args.contents, styles=args.styles, out=Path("."), seed=777))
    triplets = [teacher.triplet(i, SCORE_SIZE) for i in range(args.n)]
    contents = [t[0] for t in triplets]
    styles = [t[1] for t in triplets]
    targets = [t[2] for t in triplets]
    c, s = batch(contents), batch(styles)
    rows = {"copy-content": score(contents, c, s),
            "reinhard": score([reinhard_transfer(a, b) for a, b in zip(contents, styles)], c, s),
            "teacher (256 px)": score(targets, c, s)}
    for size in (64, 128):
        small = [t.resize((size, size), Image.LANCZOS) for t in targets]
        rows[f"teacher at {size} px, bicubic"] = score(small, c, s)
        rows[f"teacher at {size} px, guided"] = score([guided(d, ct) for d, ct in zip(small, contents)], c, s)
    for tok in args.tokenizer or []:
        recon = reconstruct(tok, targets)
        rows[f"tokenizer {tok.name or tok} recon ({recon[0].width} px), guided"] = score(
            [guided(d, ct) for d, ct in zip(recon, contents)], c, s)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--contents", type=Path, required=True)
    p.add_argument("--styles", type=Path, required=True)
    p.add_argument("--tokenizer", type=Path, action="append", help="a tokenizer folder or model directory")
    p.add_argument("--n", type=int, default=24)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    rows = ceilings(a)
    print(ceiling_markdown(rows))
    if a.out:
        a.out.write_text(json.dumps({"n": a.n, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
