"""CPU inference, stage by stage, on the reference-shaped configuration of issue 18.

The configuration, written in the reference's config.json fields (`REFERENCE_CONFIG`): VAR's tokenizer
layout (ch_mult (1, 1, 2, 2, 4), downsampling 16) at base width ch 32 as in the reference's golden_small
config, V = 4096, Cvae 32, 8 scales (1, 2, 3, 4, 5, 6, 8, 10) = 195 tokens at 160 px, and a depth-8
StyleVAR (width 512, 8 heads) with ResNet-18 image encoders; random weights. (The issue does not state the
tokenizer width; ch 32 is the one its stage times fit: 3.4 GFLOP per encode, 6.2 per decode, against 84 and
154 at the published ch 160.)

    python -m benchmarks.cpu_pipeline [--batch-sizes 1,4] [--repeats 7] [--threads 2] \
        [--precision fp32|int8 [--with-fp32]] [--plain] [--json]

Per batch size it prints, for the plain model (exactly as built: the "before") and the prepared one
(`stylevar.inference.prepare`, fp32 or `--precision int8`; `--with-fp32` adds prepared fp32 beside int8),
the median ms per image of each stage and of the whole `generate` call:
  encode    two VQ-VAE encodes (content and style: encoder, quant_conv, multi-scale quantisation)
  encoders  the two ResNet-18 image encoders (pooled)
  condition everything `StyleVAR.condition` does (the two rows above plus the token embeddings)
  loop      `StyleVAR.sample_tokens` (the coarse-to-fine transformer loop, top-k 900 / top-p 0.96)
  decode    the final VQ-VAE decode
  total     `StyleVAR.generate` end to end (what a caller waits for)
Each stage is timed with the models' calls taking turns in one process (same weights, same inputs), so a
shared machine's changing load weighs on each alike; stages are separate medians, so `condition + loop +
decode` is close to, not equal to, `total`. With int8 it also prints the token agreement with the plain
fp32 model (same inputs and seeds, `--agreement-seeds` images). `--plain` times the plain model alone.

The reference is not vendored. Its figures are the issue's side-by-side measurement on an idle machine:
1001 ms per image at batch 1 against this project's 715 ms (1.40x) and 1.49x this project's time at
batch 4. Under another load the script scales them from the plain model's time measured in the same run
(reference ~= 1.40 x plain at batch 1, 1.49 x plain at batch 4) and prints each model's ratio to that.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from dataclasses import dataclass

import torch

from stylevar.config import StyleVARConfig, VQVAEConfig
from stylevar.pipeline import StylePipeline

# the side-by-side measurement of the reference code on this configuration (CPU, 2 threads):
# 1001 ms per image at batch 1, and 1.49x this project's batch-4 time of then
REFERENCE_MS_BATCH1 = 1001.0
OURS_MS_BATCH1_THEN = 715.0
# the reference's time over this project's plain model, as the issue measured them side by side
REFERENCE_OVER_PLAIN = {1: REFERENCE_MS_BATCH1 / OURS_MS_BATCH1_THEN, 4: 1.49}


@dataclass(frozen=True)
class StageBenchConfig:
    batch_sizes: tuple[int, ...] = (1, 4)
    repeats: int = 7
    warmup: int = 2
    threads: int = 2
    precision: str = "fp32"
    plain: bool = False
    agreement_seeds: int = 8
    seed: int = 0


# the configuration in the reference's own config.json fields (as in its golden_small config, at 160 px)
REFERENCE_CONFIG = {"patch_nums": [1, 2, 3, 4, 5, 6, 8, 10], "V": 4096, "Cvae": 32, "ch": 32, "share_quant_resi": 4,
                    "depth": 8, "attn_l2_norm": True}


def reference_shaped() -> tuple[VQVAEConfig, StyleVARConfig]:
    """The reference-shaped configuration: 160 px, 8 scales up to 10 x 10, V 4096, depth 8."""
    vq = VQVAEConfig.from_reference(REFERENCE_CONFIG)
    assert vq.image_size == 160
    return vq, StyleVARConfig.from_reference(REFERENCE_CONFIG)


def build(cfg: StageBenchConfig, precision: str | None = None):
    """The reference-shaped model with random weights (seed `cfg.seed`): plain, or prepared."""
    from stylevar.inference import InferenceConfig, prepare

    model = StylePipeline.random(reference_shaped(), seed=cfg.seed).model.eval()
    if cfg.plain:
        return model
    return prepare(model, InferenceConfig(precision=precision or cfg.precision))


def images(batch: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    content = torch.rand(batch, 3, size, size, generator=g) * 2 - 1
    style = torch.rand(batch, 3, size, size, generator=g) * 2 - 1
    return content, style


STAGES = ("encode", "encoders", "condition", "loop", "decode", "total")


@torch.inference_mode()
def time_stages(models: dict, batch: int, cfg: StageBenchConfig) -> dict[str, dict[str, float]]:
    """Median ms per image of every stage for each model (same weights), stage by stage with the models'
    calls taking turns, so a shared machine's changing load weighs on each alike."""
    from stylevar.encoders import pooled
    from stylevar.sampling import make_generators

    size = next(iter(models.values())).tokenizer.cfg.image_size
    content, style = images(batch, size, cfg.seed + batch)

    def stage_fns(model):
        tok, alpha_K = model.tokenizer, model.blend_alphas()
        cond = model.condition(content, style)
        f_hat, _ = model.sample_tokens(cond, make_generators(0, batch, content.device), alpha_K)
        return {
            "encode": lambda: (tok.encode(content), tok.encode(style)),
            "encoders": lambda: (pooled(model.style_encoder, style), pooled(model.content_encoder, content)),
            "condition": lambda: model.condition(content, style),
            "loop": lambda: model.sample_tokens(cond, make_generators(0, batch, content.device), alpha_K),
            "decode": lambda: tok.decode_fhat(f_hat),
            "total": lambda: model.generate(content, style, seed=0),
        }

    fns = {name: stage_fns(m) for name, m in models.items()}
    out: dict[str, dict[str, float]] = {name: {} for name in models}
    for stage in STAGES:
        times: dict[str, list[float]] = {name: [] for name in models}
        for r in range(cfg.warmup + cfg.repeats):
            for name in models:
                t0 = time.perf_counter()
                fns[name][stage]()
                if r >= cfg.warmup:
                    times[name].append(time.perf_counter() - t0)
        for name in models:
            out[name][stage] = 1000 * statistics.median(times[name]) / batch
    return out


@torch.inference_mode()
def token_agreement(fp32_model, other_model, cfg: StageBenchConfig) -> float:
    """Fraction of sampled tokens that are equal, same inputs and seed, over `agreement_seeds` seeds."""
    equal = total = 0
    size = fp32_model.tokenizer.cfg.image_size
    for s in range(cfg.agreement_seeds):
        content, style = images(1, size, 1000 + s)
        _, a = fp32_model.generate_with_indices(content, style, seed=s)
        _, b = other_model.generate_with_indices(content, style, seed=s)
        a, b = torch.cat(a, 1), torch.cat(b, 1)
        equal += int((a == b).sum())
        total += a.numel()
    return equal / total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", default="1,4")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precision", choices=("fp32", "int8"), default="fp32")
    p.add_argument("--plain", action="store_true", help="the model as built, no stylevar.inference.prepare")
    p.add_argument("--agreement-seeds", type=int, default=8)
    p.add_argument("--with-fp32", action="store_true", help="with --precision int8: also time prepared fp32")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    cfg = StageBenchConfig(batch_sizes=tuple(int(b) for b in a.batch_sizes.split(",")), repeats=a.repeats,
                           warmup=a.warmup, threads=a.threads, precision=a.precision, plain=a.plain,
                           agreement_seeds=a.agreement_seeds)
    torch.set_num_threads(cfg.threads)
    models = {"plain": build(dataclasses.replace(cfg, plain=True))}
    if not cfg.plain:
        models[cfg.precision] = build(cfg)
    if cfg.precision != "fp32" and not cfg.plain and a.with_fp32:
        models["fp32"] = build(cfg, "fp32")
    out = {"config": "reference-shaped d8, 160 px, 8 scales, V 4096", "threads": cfg.threads,
           "repeats": cfg.repeats, "load": os.getloadavg()[0], "stages_ms_per_image": {}}
    for B in cfg.batch_sizes:
        out["stages_ms_per_image"][B] = time_stages(models, B, cfg)
    if cfg.precision != "fp32" and not cfg.plain:
        out["token_agreement_with_fp32"] = token_agreement(models["plain"], models[cfg.precision], cfg)
    out["load_after"] = os.getloadavg()[0]
    if a.json:
        print(json.dumps(out))
        return 0
    print(f"{out['config']}; {cfg.threads} threads; median of {cfg.repeats}; load {out['load']:.2f} -> "
          f"{out['load_after']:.2f}")
    for B, per_model in out["stages_ms_per_image"].items():
        for name, st in per_model.items():
            cells = "  ".join(f"{k} {v:7.1f}" for k, v in st.items())
            print(f"  batch {B} {name:>5}: ms/image  {cells}")
        if len(per_model) > 1:
            plain = per_model["plain"]["total"]
            print("    total vs plain: " + ", ".join(f"{n} {plain / st['total']:.2f}x faster"
                                                   for n, st in per_model.items() if n != "plain"))
            if B in REFERENCE_OVER_PLAIN:  # the reference's time here, scaled from the plain model's
                ref = REFERENCE_OVER_PLAIN[B] * plain
                print(f"    vs the reference (~{ref:.0f} ms/image here = {REFERENCE_OVER_PLAIN[B]:.2f} x plain): "
                      + ", ".join(f"{n} {ref / st['total']:.2f}x faster" for n, st in per_model.items()))
    if "token_agreement_with_fp32" in out:
        print(f"  token agreement with fp32 (same seeds, {cfg.agreement_seeds} images): "
              f"{100 * out['token_agreement_with_fp32']:.2f}%")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
