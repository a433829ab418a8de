"""The measurements of `python -m benchmarks.precision_quality`: the demo model prepared per precision, its
metrics, and its tokens and pictures against the plain fp32 model's."""
from __future__ import annotations

import argparse
import copy
import os

import torch

from stylevar.runtime.inference import PRECISIONS, InferenceConfig, prepare
from stylevar.loaders.model_dir import DEMO_MODEL_DIR
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.models.transformer import Generated
from stylevar.utils.threads import apply_threads
from training.parts import demo_export as demo


@torch.inference_mode()
def raw_generation(pipe: StylePipeline, triplets: list[demo.Triplet], seed: int) -> Generated:
    """The model's pictures (no refinement) and sampled tokens for `triplets`, seed + index each, with the
    model's recommended sampling settings."""
    content, _ = pipe.preprocess([t.content for t in triplets])
    style, _ = pipe.preprocess([t.style for t in triplets])
    settings = pipe.generation_config(seed=[seed + i for i in range(len(triplets))]).kwargs()
    return pipe.model.generate_with_indices(content, style, **settings)


def agreement(plain: Generated, other: Generated) -> tuple[float, float]:
    """Share of sampled tokens equal to the plain model's, and the mean absolute difference of the pictures
    (in [0, 1]), for the same inputs and seeds."""
    equal = torch.cat([(x == y).flatten() for x, y in zip(plain.indices, other.indices)]).float().mean()
    return float(equal), float((plain.images - other.images).abs().mean())


def measure(a: argparse.Namespace) -> dict:
    """The rows of `python -m benchmarks.precision_quality` (its options ``a``): the demo's metrics, token agreement
    and pixel difference per precision and set, beside the baselines."""
    apply_threads(a.threads)
    plain = StylePipeline.from_pretrained(DEMO_MODEL_DIR, device="cpu")
    sets = {"held-out synthetic": demo.heldout_triplets(a.n, plain.image_size),
            "photographs": demo.photo_triplets(plain.image_size)}
    out: dict = {"model": plain.config.label,
                 "n": {k: len(v) for k, v in sets.items()}, "load": os.getloadavg()[0], "rows": {}}
    suite = demo.make_suite()  # SSIM (and LPIPS, DreamSim, CLIP where their weights are cached)
    plain_runs = {name: raw_generation(plain, triplets, a.seed) for name, triplets in sets.items()}
    for precision in PRECISIONS:
        pipe = StylePipeline(prepare(copy.deepcopy(plain.model), InferenceConfig(precision=precision)), plain.config)
        for name, triplets in sets.items():
            row = demo.evaluate_model(pipe, triplets, a.seed, suite)
            same = agreement(plain_runs[name], raw_generation(pipe, triplets, a.seed))
            row["token_agreement"], row["pixel_diff"] = same
            out["rows"].setdefault(name, {})[precision] = row
    for name, triplets in sets.items():
        out["rows"][name].update(demo.score_baselines(triplets, plain.image_size, suite))
    return out
