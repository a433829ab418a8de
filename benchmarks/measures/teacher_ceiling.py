"""The measurements of `python -m benchmarks.teacher_ceiling` (its docstring says what each row is): the teacher's
pictures of real photographs x paintings at the photograph's size, and what survives drawing them at N px and
each tokenizer, all scored at 256 px with the real-pairs measures."""
from __future__ import annotations

import argparse

import torch
from PIL import Image

from stylevar.baselines.magenta import MagentaStylizer
from stylevar.baselines.reinhard import reinhard_transfer
from stylevar.evaluate.real_pairs import RealPairs, Scorer
from stylevar.processing.images import fit_square, pil_to_tensor, tensor_to_pil
from stylevar.processing.upsample import Upsampling, upscale

SIDES = (64, 128, 256)
FIT = "stretch"  # the pipeline's default square fit (StylePipeline.__call__'s resize)


def back_to_size(drawing: Image.Image, content: Image.Image, mode: str) -> Image.Image:
    """A square drawing of the content (the pipeline's square fit) brought to the content's size as the
    pipeline does: "guided" (the default) or "bicubic"."""
    seen, fit = fit_square(content, drawing.width, FIT)
    return upscale(pil_to_tensor(drawing), pil_to_tensor(seen), fit, content, None, Upsampling(mode=mode))


@torch.no_grad()
def reconstruct(tokenizer_dir, images: list[Image.Image]) -> list[Image.Image]:
    """Each picture's square fit at the tokenizer's size, encoded and decoded (the tokenizer's config.json)."""
    from stylevar.models.tokenizer import MultiScaleVQVAE

    tok = MultiScaleVQVAE.from_pretrained(tokenizer_dir).eval()
    side = tok.cfg.image_size
    out = []
    for im in images:
        x = pil_to_tensor(fit_square(im, side, FIT)[0])[None] * 2 - 1
        out.append(tensor_to_pil(tok.decode_indices(tok.encode_indices(x)).add(1).mul(0.5).clamp(0, 1)[0]))
    return out


def ceilings(args: argparse.Namespace) -> dict[str, dict]:
    spec = RealPairs.from_folders(args.contents, args.styles, args.photos, args.art, args.max_side)
    pairs = spec.load()
    contents = [c for c, _ in pairs]
    teacher = MagentaStylizer()
    painted = [teacher(c, s) for c, s in pairs]
    scorer = Scorer()
    refs = scorer.references(contents, [s for _, s in pairs])

    def row(images: list[Image.Image]) -> dict[str, float]:
        return {k: float(v.mean()) for k, v in scorer(images, refs).items()}

    rows = {"copy-content": row(contents),
            "reinhard": row([reinhard_transfer(c, s) for c, s in pairs]),
            "the teacher at full size": row(painted)}
    for side in SIDES:
        small = [fit_square(p, side, FIT)[0] for p in painted]
        for mode in ("bicubic", "guided"):
            rows[f"the teacher at {side} px, {mode}"] = row([back_to_size(d, c, mode) for d, c in zip(small, contents)])
    for tok in args.tokenizer or []:
        recon = reconstruct(tok, painted)
        rows[f"through tokenizer {tok.name or tok} ({recon[0].width} px), guided"] = row(
            [back_to_size(d, c, "guided") for d, c in zip(recon, contents)])
    return rows
