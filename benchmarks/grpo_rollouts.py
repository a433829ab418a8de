"""Time per GRPO step with batched rollouts (one `generate` call for all B * G rows) against a loop of
single-row `generate` calls (the reference's way), same G, same seeds, same update.

    python -m benchmarks.grpo_rollouts [--model DIR | --preset tiny] [--group-size 16] [--batch-size 2] \
        [--steps 3] [--warmup 1] [--device cpu|cuda] [--threads N]

Each mode runs `--warmup` + `--steps` full GRPO steps (rollouts, ssim reward, old/ref/new teacher forcing,
AdamW) from the same starting weights on synthetic triplets, the two modes taking turns step by step; the
tokens sampled by the two modes are compared. Prints one JSON object: seconds per step and per rollout phase for each mode, and the ratios
loop / batched.
"""
from __future__ import annotations

import argparse
import json
import sys

from stylevar.utils.helptext import DEVICE_AUTO, HelpFormatter


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.grpo_rollouts", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--model", default=None, help="model directory (default: a random --preset model)")
    p.add_argument("--preset", default="tiny", help="the random model's preset (without --model)")
    p.add_argument("--group-size", type=int, default=16, help="G rollouts per triplet")
    p.add_argument("--batch-size", type=int, default=2, help="triplets per step")
    p.add_argument("--steps", type=int, default=3, help="timed steps per mode")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per mode before the timed ones")
    p.add_argument("--lora-rank", type=int, default=16, help="rank of the LoRA adapters (alpha: twice the rank)")
    p.add_argument("--rollout-chunk", type=int, default=0, help="rows per generate call (0: all B*G at once)")
    p.add_argument("--tf-chunk", type=int, default=0, help="rows per teacher-forcing pass (0: all)")
    p.add_argument("--device", default=None, help=f"cpu or cuda (default: {DEVICE_AUTO})")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: leave as is)")
    args = p.parse_args(argv)
    from benchmarks.measures.grpo_rollouts import measure  # torch: once the options are parsed
    from stylevar.utils.precision import set_matmul_precision

    set_matmul_precision()  # TF32 on CUDA

    print(json.dumps(measure(args), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
