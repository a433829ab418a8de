"""Parameters and estimated peak training memory per GPU of each preset under ``training.sft``'s two
strategies, computed from the models (not measured): ``python -m benchmarks.memory_table``. With ``--serving``:
d20's generation memory per batch size and the batch each budget holds, measured on the meta device
(`stylevar.runtime.memory`: the tables of docs/serving.md, "Batching", and docs/gpus.md).

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
import sys

from stylevar.utils.helptext import HelpFormatter


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.memory_table", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--gpus", type=int, default=8, help="GPUs the fsdp shards are spread over")
    p.add_argument("--micro-batch", type=int, default=8, help="samples per GPU per micro-step")
    p.add_argument("--serving", action="store_true", help="generation's memory per batch size instead (d20)")
    args = p.parse_args(argv)
    from benchmarks.measures.memory_table import fitting_table, serving_table, table  # torch: once parsed

    print(f"{serving_table()}\n\n{fitting_table()}" if args.serving else table(args.gpus, args.micro_batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
