"""Parameters and estimated peak training memory per GPU of each preset under ``training.sft``'s two
strategies, computed from the models (not measured): ``python -m benchmarks.memory_table``.

Each preset is built on the ``meta`` device (no memory, exact shapes), so the parameter counts are exact:
P trainable (everything but the tokenizer), P_t the frozen tokenizer, P_root the trainable parameters
outside the blocks (embeddings, image encoders, head), P_blk the largest block. Bytes per GPU, N GPUs,
bf16 autocast / bf16 FSDP parameters, float32 master weights, gradients and AdamW moments:

    ddp  : weights 4P + grads 4P + DDP's gradient buckets 4P + AdamW 8P + tokenizer 4P_t
    fsdp : (weights 4P + grads 4P + AdamW 8P) / N + tokenizer 4P_t
           + all-gathered bf16 parameters in flight: 2 P_root (the root, whole for the step)
             + 2 x 2 P_blk (the running block and the prefetched one) + 4 P_blk (one block's float32
             gradients before their reduce-scatter)

Activations (an estimate, the same for both strategies): per sample and block, the saved tensors of a
pre-norm transformer block in bf16 with fused attention, about 34 x L x C bytes (Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models"), times 1.5 for the style and content
key/value streams of blended attention; L = the preset's token count, C its width. With activation
checkpointing only each block's float32 input is kept (4 L C per block) plus one block's full set while
it is recomputed. Peak = static + activations x micro-batch; allocator fragmentation, the CUDA context
(~0.5-1 GiB) and temporary buffers of the loss (B x L x V logits, float32) are counted separately as the
logits term, the rest not at all.
"""
from __future__ import annotations

import argparse
import functools
import sys
import torch

from stylevar.config import presets
from stylevar.tokenizer import MultiScaleVQVAE
from stylevar.transformer import StyleVAR

GiB = 2**30
ACT_BYTES_PER_TOKEN_WIDTH = 34 * 1.5  # per block, bf16, fused attention, three streams


@functools.lru_cache
def tokenizer(cfg) -> MultiScaleVQVAE:
    with torch.device("cpu"):
        return MultiScaleVQVAE(cfg)


def count(preset: str) -> dict[str, float]:
    vq, tr = presets(preset)
    with torch.device("meta"):  # the tokenizer is built for real: its quantizer computes on construction
        model = StyleVAR(tr, tokenizer(vq))
    tok = sum(p.numel() for p in model.tokenizer.parameters())
    total = sum(p.numel() for p in model.parameters())
    blocks = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
    return {"P": total - tok, "P_t": tok, "P_blk": max(blocks), "P_root": total - tok - sum(blocks),
            "L": tr.num_tokens, "C": tr.embed_dim, "depth": tr.depth, "V": tr.vocab_size}


def estimate(c: dict[str, float], strategy: str, gpus: int, micro_batch: int, checkpointing: bool) -> dict[str, float]:
    P, Pt, Pb, Pr = c["P"], c["P_t"], c["P_blk"], c["P_root"]
    if strategy == "ddp":
        static = 4 * P + 4 * P + 4 * P + 8 * P + 4 * Pt
    else:
        static = 16 * P / gpus + 4 * Pt + 2 * Pr + 2 * 2 * Pb + 4 * Pb
    per_block = ACT_BYTES_PER_TOKEN_WIDTH * c["L"] * c["C"]
    if checkpointing:
        act = 4 * c["L"] * c["C"] * c["depth"] + per_block
    else:
        act = per_block * c["depth"]
    logits = 4 * c["L"] * c["V"] * 2  # float32 logits and their gradient
    return {"static": static, "act": (act + logits) * micro_batch, "peak": static + (act + logits) * micro_batch}


def table(gpus: int, micro_batch: int) -> str:
    rows = ["| preset | trainable params | tokenizer params | strategy | weights+grads+AdamW per GPU | "
            f"activations (micro-batch {micro_batch}) | peak per GPU | peak, activation checkpointing |",
            "|---|---|---|---|---|---|---|---|"]
    for preset in ("d16", "d20", "d24", "d30"):
        c = count(preset)
        for strategy in ("ddp", "fsdp"):
            e = estimate(c, strategy, gpus, micro_batch, False)
            ec = estimate(c, strategy, gpus, micro_batch, True)
            rows.append(f"| {preset} | {c['P'] / 1e6:,.1f}M | {c['P_t'] / 1e6:,.1f}M | {strategy} x{gpus} | "
                        f"{e['static'] / GiB:.1f} GiB | {e['act'] / GiB:.1f} GiB | {e['peak'] / GiB:.1f} GiB | "
                        f"{ec['peak'] / GiB:.1f} GiB |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=8, help="samples per GPU per micro-step")
    args = p.parse_args(argv)
    print(table(args.gpus, args.micro_batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
