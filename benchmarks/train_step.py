"""One SFT optimizer step, the public reference's trainer and this project's, timed in turns at identical weights.

A step is what both trainers do per batch: the frozen tokenizer encodes target, style and content, the
teacher-forcing forward (both ResNet-18 encoders trainable), label-smoothed (0.1) cross-entropy over the
4096-way head, backward, gradient clipping at 2.0, AdamW (0.9, 0.95), weight decay 0.05 off biases, norms and
embeddings. The configuration is `benchmarks.side_by_side.REFERENCE_CONFIG` (depth 8, 160 px, 8 scales =
255 tokens, V 4096); both models are in train mode, drop path included (the reference's 0.1 * 8 / 24).

    PYTHONPATH=/path/to/StyleVAR python -m benchmarks.train_step [--batch-sizes 1,4,8] [--precisions fp32,bf16] \
        [--levers] [--repeats 5] [--warmup 2] [--threads 2] [--json]
    python -m benchmarks.train_step --no-reference --preset d20 --device cuda --batch-sizes 16 \
        --precisions bf16 --peak-tflops 989                       # the d20 step on a GPU, with MFU

- **reference**: `train.sft_trainer.StyleVARTrainer.train_step` of the public reference
  (https://github.com/Senfier-LiqiJing/StyleVAR, a checkout on PYTHONPATH, nothing vendored), built as its
  train/train_sft.py builds it (fused AdamW as its `--afuse` default, `AmpOptimizer`, grad clip 2.0), on the
  models of `benchmarks.measures.reference_pipeline.build_reference`. What this adapter supplies: the `dist`
  stand-in of reference_pipeline; a stand-in `utils.misc` holding the two logger names the trainer imports
  (the real one imports typed-argument-parser, absent here; the step never logs: it is called with
  it = g_it = 1); the parameter groups by its `filter_params` rule (1-d, bias or a no-decay key: no decay),
  made here because that function prints through VAR's patched `print(force=)`. Its bf16 is its own
  `amp_ctx` replaced by CPU autocast (its amp_ctx is CUDA-only).
- **ours**: `training.parts.sft_objective.SFTObjective` and `training.parts.step.clip_and_step` with the optimizer of
  `training.parts.optim.make_adamw`, the model loaded from the reference's state dicts through
  `stylevar.loaders.convert` (identical weights). ``today`` is the earlier step (three tokenizer calls,
  the for-loop AdamW and clipping); ``eager`` is training.sft's step with ``--no-compile``; ``default`` is its
  default step on augmented data (the default) in a long run: the blocks compiled; ``cached`` is ``eager`` with
  the token cache (`training.parts.token_cache`: the token maps read back, no image encoded), and
  ``cached+compiled`` the default step with ``--no-augment`` (the reference's data: no augmentation), where the
  cache is on by default. `--levers` also times each lever alone on top of ``today`` (`LEVERS`).

  In bf16 ``today`` is left out: that step encoded style and content under the step's autocast, which the
  quantizer's fp32 distances refuse (it failed on its first step; the fused encode runs in fp32).

Before timing, the two trainers' losses are compared at identical weights and inputs (eval mode; and train
mode with the same seed, so the same rows are dropped); with `--levers`, each lever's first three steps
against today's from the same weights. The steps take turns call by call (`time_steps`). Output: median
wall-clock ms per step, samples/s, median CPU ms per step (the process's, all threads: the steadier measure
on a shared machine; run with OMP_WAIT_POLICY=PASSIVE, or waiting OpenMP threads count as work), the
reference's time over ours in both, the machine's load average before and after.
"""
from __future__ import annotations

import argparse
import json
import sys

from benchmarks.side_by_side import timing_arguments
from benchmarks.train_step_config import VARIANTS, StepBenchConfig
from stylevar.utils.helptext import HelpFormatter
from stylevar.utils.threads import apply_threads  # no torch


def parse_config(argv: list[str] | None) -> tuple[StepBenchConfig, bool]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.train_step", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    timing_arguments(p, repeats=5, warmup=2)
    p.set_defaults(batch_sizes="1,4,8")
    p.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16 (autocast)")
    p.add_argument("--no-reference", action="store_true", help="time this project's step alone")
    p.add_argument("--levers", action="store_true", help="also each lever alone (fp32, --lever-batch)")
    p.add_argument("--lever-batch", type=int, default=4, help="the batch the levers are timed at")
    p.add_argument("--preset", default="reference", help="reference (the shape above) or a stylevar preset "
                   "(with --no-reference)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where this project's step runs")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="> 0: report MFU against this peak")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated: {', '.join(VARIANTS)}")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    a = p.parse_args(argv)
    variants = tuple(v for v in a.variants.split(",") if v)
    if not variants or any(v not in VARIANTS for v in variants):
        p.error(f"--variants: each one of {', '.join(VARIANTS)}")
    if not a.no_reference and (a.preset != "reference" or a.device != "cpu"):
        p.error("the reference runs on the CPU at the reference shape: add --no-reference")
    cfg = StepBenchConfig(batch_sizes=tuple(int(b) for b in a.batch_sizes.split(",") if b),
                          precisions=tuple(x for x in a.precisions.split(",") if x), repeats=a.repeats,
                          warmup=a.warmup, threads=a.threads, reference=not a.no_reference, levers=a.levers,
                          lever_batch=a.lever_batch, preset=a.preset, device=a.device, peak_tflops=a.peak_tflops,
                          variants=variants)
    return cfg, a.json


def main(argv: list[str] | None = None) -> int:
    cfg, as_json = parse_config(argv)
    # torch: once the options are parsed
    from benchmarks.measures.reference_pipeline import ReferenceMissing, missing_message
    from benchmarks.measures.train_step import measure, print_report
    from stylevar.utils.precision import set_matmul_precision

    apply_threads(cfg.threads)
    set_matmul_precision()  # TF32 on CUDA
    try:
        out = measure(cfg)
    except (ImportError, ReferenceMissing) as e:
        print(f"train_step: {missing_message(ReferenceMissing(str(e)))}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(out))
    else:
        print_report(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
