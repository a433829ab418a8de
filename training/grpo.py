"""GRPO fine-tuning of StyleVAR with LoRA and a perceptual reward: ``python -m training.grpo``.

    python -m training.grpo --data MANIFEST --init MODEL_DIR --out RUN --reward dreamsim|lpips|clip|ssim|l1 \
        --group-size G --batch-size B --max-steps N [--lora-rank 256 --lora-alpha 512 ...]
    torchrun --nproc_per_node P -m training.grpo ...        # the same run on P processes

One step, for B triplets (content, style, target):
1. Rollouts: G samples per triplet from the current policy (LoRA on; top-k 900, top-p 0.96) in one
   batched ``generate`` call for all B * G rows (``--rollout-chunk`` rows at a time if memory needs it);
   row i of step s uses the seed derived from (seed, s, i), so a step is reproducible.
2. Reward R = -lambda * dist(generated, target) (training.parts.rewards); advantage per group
   A = (R - mean_G R) / (std_G R + eps).
3. Log-probabilities of the sampled tokens by teacher forcing, in fp32 whatever ``--precision`` says
   (it only affects the rollouts): ``old`` (rollout policy, no grad), ``ref`` (LoRA disabled, no grad),
   ``new`` (with grad, once per ``--ppo-epochs``; ``old`` stays the one computed before the updates).
4. Per token: policy term -min(rho A, clip(rho, 1 - eps, 1 + eps) A) with rho = exp(new - old); KL k3 with
   d = ref - new: beta (exp(d) - 1 - d). PANW token weights w = (h_k w_k)^-gamma / Z (sum 1 over the L
   tokens). Loss = mean over rollouts of sum over tokens of w (policy + KL). AdamW on the LoRA matrices.
5. Iterative merge (``training.parts.merge_control``): a reward EMA and the LoRA snapshot at its peak; when the
   EMA has beaten the last merge baseline by ``--merge-min-gain`` for ``--merge-patience`` steps and
   ``--merge-cooldown`` steps have passed since the last merge, the peak snapshot is baked into the
   base weights and LoRA restarts at zero (B = 0, A redrawn from (seed, merge count)), the optimizer
   state is cleared and the baseline becomes the peak EMA. An emergency merge (same procedure) happens
   when the raw KL exceeds ``--emergency-kl`` (own cooldown ``--emergency-cooldown``); a step whose
   raw KL in any group exceeds ``--skip-kl`` makes no update. Raw KL = the PANW-weighted token mean of
   k3(ref - old) (no beta), measured before the update; ``kl`` in the log is its mean over rollouts.

The model runs in eval mode throughout (no dropout; the encoders' norm statistics stay fixed), so
teacher forcing of the rollout policy reproduces its log-probabilities: at the first update old and
new are identical and every ratio is 1 (``ratio_dev`` in the log is max |rho - 1| of the first epoch).

``RUN/log.jsonl`` (every ``--log-every`` steps, means over the window; ``merged``/``skipped`` counts):
step, reward_mean, reward_std (over all rollouts), reward_group_std (mean within-group std), kl,
kl_group_max, loss, clip_frac (tokens with |rho - 1| > eps, last epoch), ratio_dev, grad_norm, merged,
emergency, skipped, reward_ema, lr, entropy_s{k} (policy entropy per scale), timings. TensorBoard gets
the same. Resume (model incl. LoRA and merged base, optimizer, merge state, data position, RNG) through
training.parts, the same parts SFT uses; ``RUN/final/`` is a plain model directory with LoRA
merged (any checkpoint: ``python -m training.merge_lora RUN``, also ``stylevar merge-lora RUN``).

This module is the command (its options; ``--help`` imports no torch); the run is made of
`training.parts.grpo_objective` (the loss's terms), `training.parts.grpo_trainer` (one step: rollouts, rewards, the update,
merges) and `training.parts.grpo_run` (the checks, RUN/, the step loop, RUN/final).
"""
from __future__ import annotations

import argparse
import sys

from stylevar.loaders import hub
from stylevar.config import DEFAULT_GENERATION
from training.parts.cli import add_loop_args, recipe_parser
from training.parts.rewards import REWARDS


def build_parser() -> argparse.ArgumentParser:
    p = recipe_parser("training.grpo", __doc__)
    p.add_argument("--init", required=True, metavar="MODEL_DIR",
                   help=f"model directory to start from (e.g. an SFT RUN/final), or a hub id {hub.ID_FORM}")
    p.add_argument("--name", default="stylevar-grpo", help="model name written to RUN/final/config.json")
    g = p.add_argument_group("rollouts and reward")
    g.add_argument("--reward", choices=REWARDS, default="dreamsim", help="distance to the target the reward is made of (training.parts.rewards)")
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
    args = build_parser().parse_args(argv)
    from training.parts.grpo_run import execute  # torch and the models: once the options are parsed
    from stylevar.utils.precision import set_matmul_precision

    set_matmul_precision()  # TF32 on CUDA

    return execute(args)


if __name__ == "__main__":
    sys.exit(main())
