"""GRPO fine-tuning of StyleVAR with LoRA and a perceptual reward: ``python -m training.grpo``.

    python -m training.grpo --data MANIFEST --init MODEL_DIR --out RUN --reward dreamsim|lpips|clip|ssim|l1 \
        --group-size G --batch-size B --max-steps N [--lora-rank 256 --lora-alpha 512 ...]
    torchrun --nproc_per_node P -m training.grpo ...        # the same run on P processes

A step: G rollouts per triplet, group advantages of their rewards, a clipped policy loss with KL under PANW weights,
LoRA merged when due (``training.grpo.trainer``). ``RUN/final/``: LoRA merged (any checkpoint: training.merge_lora)."""
from __future__ import annotations

import argparse
import sys

from stylevar.loaders import hub
from stylevar.config import DEFAULT_GENERATION
from training.parts.cli import add_loop_args, recipe_parser, run_recipe
from training.grpo.rewards import REWARDS


def build_parser() -> argparse.ArgumentParser:
    p = recipe_parser("training.grpo", __doc__)
    p.add_argument("--init", required=True, metavar="MODEL_DIR",
                   help=f"model directory to start from (e.g. an SFT RUN/final), or a hub id {hub.ID_FORM}")
    p.add_argument("--name", default="stylevar-grpo", help="model name written to RUN/final/config.json")
    g = p.add_argument_group("rollouts and reward")
    g.add_argument("--reward", choices=REWARDS, default="dreamsim", help="distance to the target the reward is made of (training.grpo.rewards)")
    g.add_argument("--reward-scale", type=float, default=5.0, help="lambda in R = -lambda * dist")
    g.add_argument("--reward-image-size", type=int, default=256, help="metric resolution (not for l1)")
    g.add_argument("--reward-style-weight", type=float, default=0.0,
                   help="w in dist + w * colour_swd(generated, style): a style-fidelity term (0: off)")
    g.add_argument("--lpips-net", choices=("vgg", "alex"), default="vgg", help="LPIPS backbone (--reward lpips)")
    g.add_argument("--group-size", type=int, default=16, help="G rollouts per triplet")
    g.add_argument("--top-k", type=int, default=DEFAULT_GENERATION.top_k, help="top-k of the rollouts' sampling (0: off)")
    g.add_argument("--top-p", type=float, default=DEFAULT_GENERATION.top_p, help="top-p of the rollouts' sampling (0 or 1: off)")
    g.add_argument("--style-strength", type=float, default=0.0, help="style strength of the rollouts, -1 .. 1")
    g.add_argument("--rollout-chunk", type=int, default=0, help="rows per generate call (0: all B*G at once)")
    g.add_argument("--tf-chunk", type=int, default=0, help="rows per teacher-forcing pass (0: all)")
    g = p.add_argument_group("policy loss")
    g.add_argument("--clip-eps", type=float, default=0.2, help="PPO clip range of the probability ratio")
    g.add_argument("--kl-beta", type=float, default=0.1, help="weight of the KL penalty against the LoRA-off reference")
    g.add_argument("--panw-gamma", type=float, default=0.7, help="PANW exponent: a token of scale k weighs (h_k w_k)^-gamma, normalised to sum 1")
    g.add_argument("--adv-eps", type=float, default=1e-4, help="added to the group's reward std when normalising advantages")
    g.add_argument("--ppo-epochs", type=int, default=1, help="optimizer steps per batch of rollouts")
    g = p.add_argument_group("LoRA and merging")
    g.add_argument("--lora-rank", type=int, default=256, help="rank of the LoRA adapters")
    g.add_argument("--lora-alpha", type=float, default=512.0, help="LoRA scale alpha (the update is alpha / rank x B A)")
    g.add_argument("--reward-ema", type=float, default=0.9, help="decay of the reward EMA")
    g.add_argument("--merge-min-gain", type=float, default=0.05, help="reward-EMA gain over the last merge that counts towards a merge")
    g.add_argument("--merge-patience", type=int, default=50, help="consecutive steps with that gain before a merge")
    g.add_argument("--merge-cooldown", type=int, default=300, help="steps between regular merges (0: none)")
    g.add_argument("--emergency-kl", type=float, default=2.0, help="raw KL above which the adapters are merged at once")
    g.add_argument("--emergency-cooldown", type=int, default=50, help="steps between emergency merges")
    g.add_argument("--skip-kl", type=float, default=5.0, help="a step whose group KL exceeds this makes no update")
    g.add_argument("--no-merge", action="store_true", help="never merge during training")
    add_loop_args(p, lr=1e-5, batch_size=4, max_grad_norm=1.0)
    p.set_defaults(weight_decay=0.01, log_every=1, save_every=50)
    return p


def main(argv: list[str] | None = None) -> int:
    return run_recipe(build_parser(), "training.grpo.run", argv)


if __name__ == "__main__":
    sys.exit(main())
