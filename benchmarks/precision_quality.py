"""What the inference precisions do to the demo model's pictures: fp32 against bf16.

    python -m benchmarks.precision_quality [--n 32] [--seed 0] [--threads 2] [--json]

The demo model (stylevar/assets/demo) is prepared once per precision (`stylevar.inference.prepare`) and
run on the same held-out synthetic pairs (`training.demo.heldout_triplets`, a synthesis seed no training
data uses) and the bundled photographs, with the model's recommended sampling settings and the same seeds.
Per precision it prints the demo's evaluation metrics (`training.demo.evaluate_model` with the demo's
metric suite: edge correlation with the content, SSIM and L1 to the target where there is one, colour
distance to the style, seed spread, seconds per image; LPIPS, DreamSim, CLIP only where cached),
the share of sampled tokens equal to the plain fp32 model's, and the mean absolute pixel difference from
the plain fp32 model's pictures; copy-content and Reinhard are the baselines.
"""
from __future__ import annotations

import argparse
import copy
import json
import os

import torch

from stylevar.inference import PRECISIONS, InferenceConfig, prepare
from stylevar.model_dir import DEMO_MODEL_DIR
from stylevar.pipeline import StylePipeline
from stylevar.transformer import Generated
from training import demo


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=32, help="held-out synthetic pairs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
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
    if a.json:
        print(json.dumps(out))
        return 0
    for name, rows in out["rows"].items():
        keys = [k for k in rows["fp32"] if k not in ("token_agreement", "pixel_diff")]
        print(f"\n{name} ({out['n'][name]} pairs)")
        print("| method | " + " | ".join(keys) + " | tokens = fp32 | pixel diff |")
        print("| --- " * (len(keys) + 3) + "|")
        for method, row in rows.items():
            cells = [f"{row[k]:.4f}" if k in row else "-" for k in keys]
            extra = [f"{100 * row['token_agreement']:.1f}%", f"{row['pixel_diff']:.4f}"] if "token_agreement" in row \
                else ["-", "-"]
            print(f"| {method} | " + " | ".join(cells + extra) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
