"""Parameters and estimated peak training memory per GPU of each preset under ``training.sft``'s two strategies,
computed from the models built on the meta device (not measured); with ``--serving``, d20's generation memory per
batch size and the batch each budget holds (`stylevar.runtime.memory`: the tables of docs/serving.md and docs/gpus.md).
"""
from __future__ import annotations

import functools
import sys

from benchmarks.harness import command_parser

GiB = 2**30
ACT_BYTES_PER_TOKEN_WIDTH = 34 * 1.5  # per block, bf16, fused attention, three streams
SERVING_BATCHES = (1, 8, 16, 32, 64, 128)
SERVING_BUDGETS_GIB = (16, 40, 64, 110)


@functools.lru_cache
def tokenizer(cfg):
    import torch
    from stylevar.models.tokenizer import MultiScaleVQVAE
    with torch.device("cpu"):
        return MultiScaleVQVAE(cfg)


def count(preset: str) -> dict[str, float]:
    """Exact parameter counts: P trainable (all but the tokenizer), P_t the frozen tokenizer, P_blk the largest block,
    P_root the trainable parameters outside the blocks (embeddings, image encoders, head)."""
    import torch
    from stylevar.config import presets
    from stylevar.models.transformer import StyleVAR
    vq, tr = presets(preset)
    with torch.device("meta"):  # the tokenizer is built for real: its quantizer computes on construction
        model = StyleVAR(tr, tokenizer(vq))
    tok = sum(p.numel() for p in model.tokenizer.parameters())
    total = sum(p.numel() for p in model.parameters())
    blocks = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
    return {"P": total - tok, "P_t": tok, "P_blk": max(blocks), "P_root": total - tok - sum(blocks),
            "L": tr.num_tokens, "C": tr.embed_dim, "depth": tr.depth, "V": tr.vocab_size}


# Bytes per GPU, N GPUs, bf16 autocast / bf16 FSDP parameters, float32 master weights, gradients and AdamW moments:
#   ddp  : weights 4P + grads 4P + DDP's gradient buckets 4P + AdamW 8P + tokenizer 4P_t
#   fsdp : (weights 4P + grads 4P + AdamW 8P) / N + tokenizer 4P_t + all-gathered bf16 parameters in flight:
#          2 P_root + 2 x 2 P_blk (the running block and the prefetched one) + 4 P_blk (one block's fp32 gradients)
# Activations (an estimate, the same for both): per sample and block about 34 x L x C bytes (a pre-norm block in bf16
# with fused attention, Korthikanti et al. 2022) times 1.5 for the style and content key/value streams; with activation
# checkpointing each block's fp32 input (4 L C) plus one block's full set. The logits (B x L x V, fp32, and their
# gradient) are counted apart; the CUDA context, fragmentation and other temporary buffers are not counted.
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


def dtypes() -> tuple:
    """The dtypes the serving tables compare: fp32, bf16."""
    import torch
    return torch.float32, torch.bfloat16


def serving_table(preset: str = "d20", batches: tuple[int, ...] = SERVING_BATCHES) -> str:
    """GiB generation's loop holds per batch size (no guidance), fp32 and bf16: KV cache, queries, step, total."""
    from stylevar.config import StyleVARConfig
    from stylevar.runtime.memory import generation_memory
    cfg = StyleVARConfig.preset(preset)
    rows = ["| batch | KV cache fp32 | queries fp32 | step fp32 | **total fp32** | KV cache bf16 | queries bf16 | "
            "step bf16 | **total bf16** |", "|---|---|---|---|---|---|---|---|---|"]
    for b in batches:
        cells = []
        for dtype in dtypes():
            m = generation_memory(cfg, b, dtype)
            cells += [f"{m.kv_cache / GiB:.2f}", f"{m.queries / GiB:.2f}", f"{m.step / GiB:.2f}",
                      f"**{m.total / GiB:.2f}**"]
        rows.append(f"| {b} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def fitting_table(preset: str = "d20", budgets_gib: tuple[int, ...] = SERVING_BUDGETS_GIB) -> str:
    """The most samples whose loop fits in each budget (up to 256), fp32 and bf16, without and with guidance."""
    from stylevar.config import StyleVARConfig
    from stylevar.runtime.memory import max_batch
    cfg = StyleVARConfig.preset(preset)
    rows = ["| loop budget | fp32 | bf16 | fp32, guidance | bf16, guidance |", "|---|---|---|---|---|"]
    for budget in budgets_gib:
        cells = [str(max_batch(cfg, budget * GiB, dtype, guidance=guided))
                 for guided in (False, True) for dtype in dtypes()]
        rows.append(f"| {budget} GiB | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = command_parser("benchmarks.memory_table", __doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=8, help="GPUs the fsdp shards are spread over")
    p.add_argument("--micro-batch", type=int, default=8, help="samples per GPU per micro-step")
    p.add_argument("--serving", action="store_true", help="generation's memory per batch size instead (d20)")
    args = p.parse_args(argv)
    print(f"{serving_table()}\n\n{fitting_table()}" if args.serving else table(args.gpus, args.micro_batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
