"""The measurements of `python -m benchmarks.teacher_ceiling` (its docstring says what each row is): the teacher's
pairs, their scores at 256 px, and the shrunk, upsampled and tokenizer-reconstructed targets."""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from PIL import Image

from data_tools.teach import TeachConfig, Teacher
from stylevar.baselines.reinhard import reinhard_transfer
from stylevar.evaluate.real_pairs import SCORE_SIZE, score as score_pairs, score_batch as batch
from stylevar.processing.images import fit_square, pil_to_tensor, tensor_to_pil
from stylevar.processing.upsample import Upsampling, upscale



def score(images: list[Image.Image], contents: torch.Tensor, styles: torch.Tensor) -> dict[str, float]:
    return {k: float(v.mean()) for k, v in score_pairs(images, contents, styles).items()}


def guided(drawing: Image.Image, content: Image.Image) -> Image.Image:
    """A square drawing at the model's size brought to the content's size as the pipeline does."""
    seen, fit = fit_square(content, drawing.width)
    return upscale(pil_to_tensor(drawing), pil_to_tensor(seen), fit, content, None, Upsampling(mode="guided"))


@torch.no_grad()
def reconstruct(tokenizer_dir: Path, images: list[Image.Image]) -> list[Image.Image]:
    from training.parts.sft_model import read_tokenizer
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
