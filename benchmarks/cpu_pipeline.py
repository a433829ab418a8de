"""CPU inference, stage by stage, on the reference-shaped configuration of issue 18.

The configuration, written in the reference's config.json fields (`REFERENCE_CONFIG`): VAR's tokenizer
layout (ch_mult (1, 1, 2, 2, 4), downsampling 16) at base width ch 32 as in the reference's golden_small
config, V = 4096, Cvae 32, 8 scales (1, 2, 3, 4, 5, 6, 8, 10) = 195 tokens at 160 px, and a depth-8
StyleVAR (width 512, 8 heads) with ResNet-18 image encoders; random weights. (The issue does not state the
tokenizer width; ch 32 is the one its stage times fit: 3.4 GFLOP per encode, 6.2 per decode, against 84 and
154 at the published ch 160.)

    python -m benchmarks.cpu_pipeline [--batch-sizes 1,4] [--repeats 7] [--threads 2] \
        [--precision fp32|int8] [--plain] [--json]

Per batch size it prints the median ms per image of each stage and of the whole `generate` call:
  encode    two VQ-VAE encodes (content and style: encoder, quant_conv, multi-scale quantisation)
  encoders  the two ResNet-18 image encoders (pooled)
  condition everything `StyleVAR.condition` does (the two rows above plus the token embeddings)
  loop      `StyleVAR.sample_tokens` (the coarse-to-fine transformer loop, top-k 900 / top-p 0.96)
  decode    the final VQ-VAE decode
  total     `StyleVAR.generate` end to end (what a caller waits for)
Stages are timed separately (each its own median), so `condition + loop + decode` is close to, not
equal to, `total`. `--plain` skips `stylevar.inference.prepare` (the model exactly as built);
`--precision int8` also prints the token agreement with fp32 over `--agreement-seeds` seeds.

The script also runs against an older checkout (PYTHONPATH=that checkout) that has no
`stylevar.inference`: then it measures the plain model, which is how the "before" figures of
benchmarks/README.md were taken.
"""
from __future__ import annotations

import argparse
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
REFERENCE_RATIO_BATCH4 = 1.49


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


def _median_ms(fn, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def _prepare(model, precision: str):
    try:
        from stylevar.inference import InferenceConfig, prepare
    except ImportError:  # an older checkout: the plain model is all there is
        if precision != "fp32":
            raise SystemExit("this checkout has no stylevar.inference (int8 needs it)")
        return model, "plain (no stylevar.inference)"
    prepare(model, InferenceConfig(precision=precision))
    return model, f"stylevar.inference.prepare(precision={precision})"


def build(cfg: StageBenchConfig, precision: str | None = None):
    pipe = StylePipeline.random(reference_shaped(), seed=cfg.seed)
    model = pipe.model.eval()
    if cfg.plain:
        return model, "plain"
    return _prepare(model, precision or cfg.precision)


def images(batch: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    content = torch.rand(batch, 3, size, size, generator=g) * 2 - 1
    style = torch.rand(batch, 3, size, size, generator=g) * 2 - 1
    return content, style


@torch.inference_mode()
def time_stages(model, batch: int, cfg: StageBenchConfig) -> dict[str, float]:
    from stylevar.encoders import pooled
    from stylevar.sampling import make_generators

    content, style = images(batch, model.tokenizer.cfg.image_size, cfg.seed + batch)
    tok = model.tokenizer
    alpha_K = model.blend_alphas()
    cond = model.condition(content, style)
    f_hat, _ = model.sample_tokens(cond, make_generators(0, batch, content.device), alpha_K)
    r, w = cfg.repeats, cfg.warmup
    ms = {
        "encode": _median_ms(lambda: (tok.encode(content), tok.encode(style)), r, w),
        "encoders": _median_ms(lambda: (pooled(model.style_encoder, style), pooled(model.content_encoder, content)),
                               r, w),
        "condition": _median_ms(lambda: model.condition(content, style), r, w),
        "loop": _median_ms(lambda: model.sample_tokens(cond, make_generators(0, batch, content.device), alpha_K), r, w),
        "decode": _median_ms(lambda: tok.decode_fhat(f_hat), r, w),
        "total": _median_ms(lambda: model.generate(content, style, seed=0), r, w),
    }
    return {k: v / batch for k, v in ms.items()}


@torch.inference_mode()
def token_agreement(fp32_model, other_model, cfg: StageBenchConfig) -> float:
    """Fraction of sampled tokens that are equal, same inputs and seed, over `agreement_seeds` seeds."""
    equal = total = 0
    size = fp32_model.tokenizer.cfg.image_size
    for s in range(cfg.agreement_seeds):
        content, style = images(1, size, 1000 + s)
        _, a = fp32_model.generate(content, style, seed=s, return_indices=True)
        _, b = other_model.generate(content, style, seed=s, return_indices=True)
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
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    cfg = StageBenchConfig(batch_sizes=tuple(int(b) for b in a.batch_sizes.split(",")), repeats=a.repeats,
                           warmup=a.warmup, threads=a.threads, precision=a.precision, plain=a.plain,
                           agreement_seeds=a.agreement_seeds)
    torch.set_num_threads(cfg.threads)
    model, how = build(cfg)
    out = {"config": "reference-shaped d8, 160 px, 8 scales, V 4096", "model": how, "threads": cfg.threads,
           "load": os.getloadavg()[0], "stages_ms_per_image": {}}
    for B in cfg.batch_sizes:
        out["stages_ms_per_image"][B] = time_stages(model, B, cfg)
    if cfg.precision != "fp32" and not cfg.plain:
        fp32, _ = build(cfg, "fp32")
        out["token_agreement_with_fp32"] = token_agreement(fp32, model, cfg)
    out["load_after"] = os.getloadavg()[0]
    if a.json:
        print(json.dumps(out))
        return 0
    print(f"{out['config']}; {how}; {cfg.threads} threads; load {out['load']:.2f} -> {out['load_after']:.2f}")
    for B, st in out["stages_ms_per_image"].items():
        cells = "  ".join(f"{k} {v:7.1f}" for k, v in st.items())
        print(f"  batch {B}: ms/image  {cells}")
    if B := 1 if 1 in out["stages_ms_per_image"] else None:
        t = out["stages_ms_per_image"][1]["total"]
        print(f"  batch 1 total vs the reference's {REFERENCE_MS_BATCH1:.0f} ms: {REFERENCE_MS_BATCH1 / t:.2f}x faster")
    if "token_agreement_with_fp32" in out:
        print(f"  token agreement with fp32 (same seeds, {cfg.agreement_seeds} images): "
              f"{100 * out['token_agreement_with_fp32']:.2f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
