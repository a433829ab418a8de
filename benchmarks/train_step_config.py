"""What `python -m benchmarks.train_step` runs: the levers of this project's training step, the named variants
(today's step, training.sft's eager step, its default, with the token cache, both) and the benchmark's settings
(`StepBenchConfig`). No torch here: the command's --help reads them; `benchmarks.measures.train_step` runs them."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Levers:
    """How this project's step is run (each one changes speed, not what is learned beyond float rounding)."""

    fuse_encodes: bool = True  # target, style and content through the tokenizer in one call
    token_cache: bool = False  # the token maps read back (training.parts.token_cache): no image encoded
    fused_adamw: bool = True  # AdamW's fused kernel (one pass over all parameters) on the CPU as on CUDA
    foreach_clip: bool = True  # the grad norm of all gradients in one foreach pass
    channels_last: bool = False  # the image encoders' and the tokenizer's convolutions in NHWC
    compile: bool = False  # the transformer blocks through torch.compile (training.sft --compile)


TODAY = Levers(fuse_encodes=False, fused_adamw=False, foreach_clip=False)
EAGER = Levers(channels_last=True)  # training.sft --no-compile (the earlier default; NHWC on the CPU only)
DEFAULT = Levers(channels_last=True, compile=True)  # training.sft's default, augmented data (no cache), a long run
CACHED = Levers(token_cache=True, channels_last=True)  # --no-augment --no-compile
COMPILED = Levers(token_cache=True, channels_last=True, compile=True)  # the default with --no-augment
VARIANTS = {"today": TODAY, "eager": EAGER, "default": DEFAULT, "cached": CACHED, "cached+compiled": COMPILED}
# each lever alone, on top of today's step
LEVERS = {
    "fused encodes": dataclasses.replace(TODAY, fuse_encodes=True),
    "token cache": dataclasses.replace(TODAY, token_cache=True),
    "fused AdamW": dataclasses.replace(TODAY, fused_adamw=True),
    "foreach clip": dataclasses.replace(TODAY, foreach_clip=True),
    "channels-last encoders": dataclasses.replace(TODAY, channels_last=True),
    "compiled blocks": dataclasses.replace(TODAY, compile=True),
}


@dataclass(frozen=True)
class StepBenchConfig:
    batch_sizes: tuple[int, ...] = (1, 4, 8)
    precisions: tuple[str, ...] = ("fp32", "bf16")
    repeats: int = 5
    warmup: int = 2
    threads: int = 2
    reference: bool = True
    levers: bool = False  # also each lever alone (at --lever-batch, fp32)
    lever_batch: int = 4
    preset: str = "reference"  # or a stylevar preset (tiny, d16, d20, ...) for --no-reference runs
    device: str = "cpu"
    peak_tflops: float = 0.0  # > 0: MFU = counted FLOPs per second over this peak
    variants: tuple[str, ...] = tuple(VARIANTS)
    seed: int = 0
