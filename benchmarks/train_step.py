"""One SFT optimizer step, the public reference's trainer (`benchmarks.reference`) and this project's, timed taking
turns at identical weights (wall-clock and process CPU time), after their losses are compared at the same inputs.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from benchmarks.harness import command_parser, take_turns, timing_arguments
from stylevar.utils.threads import apply_threads  # no torch

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Levers:
    """How this project's step is run (each one changes speed, not what is learned beyond float rounding)."""

    fuse_encodes: bool = True  # target, style and content through the tokenizer in one call
    token_cache: bool = False  # the token maps read back (training.parts.token_cache): no image encoded
    fused_adamw: bool = True  # AdamW's fused kernel (one pass over all parameters) on the CPU as on CUDA
    foreach_clip: bool = True  # the grad norm of all gradients in one foreach pass
    channels_last: bool = False  # the image encoders' and the tokenizer's convolutions in NHWC
    compile: bool = False  # the transformer blocks through torch.compile (training.sft --compile)


TODAY = Levers(fuse_encodes=False, fused_adamw=False, foreach_clip=False)  # the step before the levers
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
EVERY = {"today": TODAY, **LEVERS, **VARIANTS}  # today's step first, each lever alone, every variant


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


LABEL_SMOOTHING, LR, WEIGHT_DECAY, MAX_GRAD_NORM = 0.1, 1e-4, 0.05, 2.0
# the reference's no-weight-decay name fragments (train/train_sft.py's filter_params call)
REFERENCE_NO_DECAY = ("cls_token", "start_token", "task_token", "cfg_uncond", "pos_embed", "pos_1LC", "pos_start",
                      "start_pos", "lvl_embed", "gamma", "beta", "ada_gss", "moe_bias", "scale_mul")


def import_reference_trainer():
    """The reference's `StyleVARTrainer` and `AmpOptimizer` (with stand-ins for what it imports)."""
    from benchmarks.reference import import_reference
    if "dist" not in sys.modules:
        import_reference()  # registers the `dist` stand-in when none is importable
    if "utils.misc" not in sys.modules:
        misc = types.ModuleType("utils.misc")
        misc.MetricLogger = misc.TensorboardLogger = object  # type: ignore[attr-defined]
        sys.modules["utils.misc"] = misc
    from train.sft_trainer import StyleVARTrainer
    from utils.amp_sc import AmpOptimizer
    return StyleVARTrainer, AmpOptimizer


def reference_groups(model: torch.nn.Module) -> tuple[list[str], list[torch.nn.Parameter], list[dict]]:
    names, paras, decay, no_decay = [], [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        names.append(name)
        paras.append(p)
        frozen_wd = p.ndim == 1 or name.endswith("bias") or any(k in name for k in REFERENCE_NO_DECAY)
        (no_decay if frozen_wd else decay).append(p)
    return names, paras, [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]


def reference_step(bundle, batch: dict[str, torch.Tensor], precision: str) -> Callable[[], None]:
    """One call of the reference trainer's train_step on ``batch`` (its models in train mode)."""
    import torch
    StyleVARTrainer, AmpOptimizer = import_reference_trainer()
    model = bundle.model.train()
    names, paras, groups = reference_groups(model)
    opt = AmpOptimizer(mixed_precision=0, optimizer=torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.95), fused=True),
                       names=names, paras=paras, grad_clip=MAX_GRAD_NORM)
    if precision == "bf16":
        opt.amp_ctx = torch.autocast("cpu", dtype=torch.bfloat16)
    model.require_backward_grad_sync = True  # what its DDP wrapper would carry
    pn = tuple(model.patch_nums)
    trainer = StyleVARTrainer(device=torch.device("cpu"), patch_nums=pn, resos=tuple(16 * p for p in pn),
                              vae_local=bundle.vae, var_wo_ddp=model, var=model, var_opt=opt,
                              label_smooth=LABEL_SMOOTHING)
    quiet = types.SimpleNamespace(log_iters=(), update=lambda **kw: None)
    return lambda: trainer.train_step(it=1, g_it=1, stepping=True, metric_lg=quiet, tb_lg=None,
                                      inp_B3HW=batch["target"], style_B3HW=batch["style"],
                                      content_B3HW=batch["content"], prog_si=-1, prog_wp_it=1.0)


def reference_loss(bundle, batch: dict[str, torch.Tensor], seed: int) -> float:
    """The reference's training loss of ``batch`` (no step), its random draws from ``seed``."""
    import torch
    import torch.nn.functional as F
    vae, q, model = bundle.vae, bundle.vae.quantize, bundle.model
    with torch.no_grad():
        gt = vae.img_to_idxBl(batch["target"])
        style = q.msBllist_to_BlCvae(vae.img_to_idxBl(batch["style"]))
        content = q.msBllist_to_BlCvae(vae.img_to_idxBl(batch["content"]))
        torch.manual_seed(seed)
        logits = model(q.idxBl_to_var_input(gt), style, content, batch["style"], batch["content"])
        return float(F.cross_entropy(logits.flatten(0, 1), torch.cat(gt, 1).flatten(), label_smoothing=LABEL_SMOOTHING))


def our_batch(model, batch: dict[str, torch.Tensor], levers: Levers) -> dict[str, torch.Tensor]:
    """``batch`` as training.sft feeds it: with the token cache, the token maps it holds (made once, here)."""
    import torch
    from training.parts.token_inputs import encode_triplets
    out = dict(batch)
    if levers.token_cache:
        indices_3BL = encode_triplets(model.tokenizer, batch["target"], batch["style"], batch["content"])[1]
        out["tokens_B3L"] = indices_3BL.to(torch.int16)  # as stored
    return out


def our_step(model, batch: dict[str, torch.Tensor], levers: Levers, precision: str) -> Callable[[], float]:
    """One optimizer step of training.sft's objective on ``batch`` (the model in train mode)."""
    from stylevar.runtime.compile import compile_blocks
    from training.parts.optim import ScheduleConfig, make_adamw, two_level_scheduler
    from stylevar.utils.precision import autocast, make_grad_scaler
    from training.sft.model import channels_last
    from training.sft.objective import SFTObjective
    from training.parts.step import clip_and_step
    model.train()
    device = batch["content"].device
    if levers.channels_last and device.type == "cpu":
        channels_last(model)
    if levers.compile:
        compile_blocks(model)  # the compile policy: room for every version of the block the variants feed
    objective = SFTObjective(model, label_smoothing=LABEL_SMOOTHING, alpha_jitter=0.0, seed=0,
                             fuse_encodes=levers.fuse_encodes)
    optimizer = make_adamw(model, LR, WEIGHT_DECAY, fused=levers.fused_adamw or device.type == "cuda")
    scheduler = two_level_scheduler(optimizer, ScheduleConfig(max_steps=10 ** 9))
    scaler = make_grad_scaler(precision, device)
    params = [p for p in model.parameters() if p.requires_grad]
    fed = our_batch(model, batch, levers)

    def step() -> float:
        with autocast(precision, device):
            loss, _ = objective(fed)
        scaler.scale(loss).backward()
        clip_and_step(params, optimizer, scaler, scheduler, MAX_GRAD_NORM, foreach=levers.foreach_clip)
        return float(loss.detach())
    return step


def our_loss(model, batch: dict[str, torch.Tensor], seed: int) -> float:
    import torch
    from training.sft.objective import SFTObjective
    objective = SFTObjective(model, label_smoothing=LABEL_SMOOTHING, alpha_jitter=0.0, seed=0)
    with torch.no_grad():
        torch.manual_seed(seed)
        return float(objective(batch)[0])


def triplets(batch: int, size: int, seed: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    from benchmarks.reference import images
    content, style = images(batch, size, seed)
    target, _ = images(batch, size, seed + 10_000)
    return {"content": content.to(device), "style": style.to(device), "target": target.to(device)}


def build_models(cfg: StepBenchConfig):
    """(reference bundle or None, our model): identical weights when the reference is built."""
    from benchmarks.reference import reference_shaped, reference_weights
    from stylevar.config import presets
    from stylevar.pipelines.pipeline import StylePipeline
    if not cfg.reference:
        shapes = reference_shaped() if cfg.preset == "reference" else presets(cfg.preset)
        return None, StylePipeline.random(shapes, seed=cfg.seed).model
    from benchmarks.reference import build_reference
    bundle = build_reference(cfg.seed)
    return bundle, reference_weights(bundle.vae.state_dict(), bundle.model.state_dict())


def agreement(bundle, ours, cfg: StepBenchConfig) -> dict[str, float]:
    """|reference loss - our loss| on the same batch: eval mode, and train mode with the same seed."""
    batch = triplets(2, ours.tokenizer.cfg.image_size, cfg.seed + 99)
    out = {}
    for mode in ("eval", "train"):
        bundle.model.train(mode == "train")
        ours.train(mode == "train")
        out[f"{mode}_loss_difference"] = abs(reference_loss(bundle, batch, 5) - our_loss(ours, batch, 5))
    return out


def lever_agreement(ours, batch_size: int, cfg: StepBenchConfig,
                    names: tuple[str, ...] | None = None) -> dict[str, dict[str, float]]:
    """Per lever (``names``; default all of EVERY), against today's step: the loss differences at steps 1 and 3 and
    the largest weight difference after 3 (fp32, same weights and batch)."""
    import torch
    batch = triplets(batch_size, ours.tokenizer.cfg.image_size, cfg.seed + 7, cfg.device)
    runs = {}
    for name, levers in {"today": TODAY, **{n: EVERY[n] for n in (names or EVERY)}}.items():
        if levers.compile:  # compiled afresh: graphs left by an earlier compile in this process do not carry over
            torch._dynamo.reset()
        model = copy.deepcopy(ours).to(cfg.device)
        step = our_step(model, batch, levers, "fp32")
        torch.manual_seed(cfg.seed)  # the same rows dropped in every run
        losses = [step() for _ in range(3)]
        runs[name] = (losses, {k: v.detach().float().cpu() for k, v in model.transformer_state_dict().items()})
    base_losses, base = runs["today"]

    def relative(w: dict[str, torch.Tensor], k: str) -> float:  # BatchNorm's running variances run to ~1e3
        return float((w[k] - base[k]).abs().max() / base[k].abs().max().clamp_min(1e-12))
    return {name: {"first_loss_difference": abs(losses[0] - base_losses[0]),
                   "third_loss_difference": abs(losses[2] - base_losses[2]),
                   "max_weight_difference": max(float((w[k] - base[k]).abs().max()) for k in base),
                   "max_relative_difference": max(relative(w, k) for k in base)}
            for name, (losses, w) in runs.items() if name != "today"}


def _synced(fn: Callable[[], object], device: str) -> Callable[[], object]:
    import torch
    from stylevar.runtime.bench import sync
    return lambda: (fn(), sync(torch.device(device)))


def time_steps(fns: dict[str, Callable[[], object]], repeats: int, warmup: int) -> dict[str, dict[str, float]]:
    """Median wall-clock and process CPU seconds of each function's calls, taking turns (`harness.take_turns`)."""
    medians = take_turns(fns, repeats, warmup, (time.perf_counter, time.process_time))
    return {name: {"wall": wall, "cpu": cpu} for name, (wall, cpu) in medians.items()}


def time_variants(bundle, ours, variants: dict[str, Levers], batch_size: int, precision: str,
                  cfg: StepBenchConfig) -> dict[str, dict[str, float]]:
    """ms per step and samples/s of the reference (when built) and each variant of ours, taking turns."""
    import torch
    from stylevar.runtime.bench import flops_of
    size = ours.tokenizer.cfg.image_size
    batch = triplets(batch_size, size, cfg.seed + batch_size, cfg.device)
    fns: dict[str, Callable] = {}
    if bundle is not None:
        fns["reference"] = reference_step(bundle, batch, precision)
    if precision != "fp32":  # the `today` step encoded style and content under autocast: it fails
        variants = {k: v for k, v in variants.items() if v.fuse_encodes or v.token_cache}
    if any(v.compile for v in variants.values()):
        torch._dynamo.reset()  # each batch size compiles afresh
    steps = {name: our_step(copy.deepcopy(ours).to(cfg.device), batch, levers, precision)
             for name, levers in variants.items()}
    fns.update({name: _synced(step, cfg.device) for name, step in steps.items()})
    timed = time_steps(fns, cfg.repeats, cfg.warmup)
    out = {name: {"ms_per_step": 1000 * t["wall"], "samples_per_s": batch_size / t["wall"],
                  "cpu_ms_per_step": 1000 * t["cpu"]} for name, t in timed.items()}
    if cfg.device == "cuda":  # what one step needs above what is held before it (all variants' weights, states)
        for name in variants:
            held = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            fns[name]()
            out[name]["step_peak_gib_above_held"] = (torch.cuda.max_memory_allocated() - held) / 2 ** 30
            out[name]["held_gib"] = held / 2 ** 30
    if cfg.peak_tflops > 0:
        for name in variants:
            flops = flops_of(steps[name])
            out[name]["tflop_per_step"] = flops / 1e12
            out[name]["mfu"] = flops / (out[name]["ms_per_step"] / 1000) / (cfg.peak_tflops * 1e12)
    return out


def cross_entropy_ms(batch: int, tokens: int, vocab: int, repeats: int) -> float:
    """Median ms of the loss alone, forward and backward, on float32 logits of the step's shape (B * L, V)."""
    import torch
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(batch * tokens, vocab, generator=g).requires_grad_()
    gt = torch.randint(0, vocab, (batch * tokens,), generator=g)

    def loss() -> None:
        F.cross_entropy(logits, gt, label_smoothing=LABEL_SMOOTHING).backward()
        logits.grad = None
    return 1000 * time_steps({"ce": loss}, repeats, 1)["ce"]["wall"]


def measure(cfg: StepBenchConfig) -> dict:
    from stylevar.runtime.inference import native_cpu_bf16
    bundle, ours = build_models(cfg)
    out: dict = {"config": "reference-shaped d8, 160 px, 8 scales (255 tokens), V 4096" if cfg.preset == "reference"
                 else f"preset {cfg.preset}", "threads": cfg.threads, "repeats": cfg.repeats,
                 "device": cfg.device, "loadavg_before": os.getloadavg(), "bf16_units": native_cpu_bf16(), "steps": {}}
    if bundle is not None:
        out["agreement"] = agreement(bundle, ours, cfg)
    variants = {name: VARIANTS[name] for name in cfg.variants}
    for precision in cfg.precisions:
        for B in cfg.batch_sizes:
            out["steps"][f"{precision} batch {B}"] = time_variants(bundle, ours, variants, B, precision, cfg)
    if cfg.levers:
        out["lever_agreement"] = lever_agreement(ours, 2, cfg)
        out["lever_batch"] = cfg.lever_batch
        out["levers"] = time_variants(bundle, ours, EVERY, cfg.lever_batch, "fp32", cfg)
        out["cross_entropy_ms"] = cross_entropy_ms(cfg.lever_batch, ours.cfg.num_tokens, ours.cfg.vocab_size,
                                                   cfg.repeats)
    out["loadavg_after"] = os.getloadavg()
    return out


def print_table(title: str, rows: dict[str, dict[str, float]]) -> None:
    print(f"  {title}")
    ref = rows.get("reference", {})
    for name, r in rows.items():
        cells = f"{r['ms_per_step']:8.0f} ms/step  {r['samples_per_s']:6.2f} samples/s  CPU {r['cpu_ms_per_step']:7.0f} ms"
        if ref and name != "reference":
            cells += (f"  {ref['ms_per_step'] / r['ms_per_step']:.2f}x the reference "
                      f"(CPU time {ref['cpu_ms_per_step'] / r['cpu_ms_per_step']:.2f}x)")
        if "step_peak_gib_above_held" in r:
            cells += f"  peak {r['step_peak_gib_above_held']:.1f} GiB above {r['held_gib']:.1f} held"
        if "mfu" in r:
            cells += f"  {r['tflop_per_step']:.2f} TFLOP/step  MFU {100 * r['mfu']:.1f}%"
        print(f"    {name:>24}: {cells}")


def print_report(out: dict) -> None:
    load = out["loadavg_before"], out["loadavg_after"]
    print(f"{out['config']}; {out['device']}; {out['threads']} threads; median of {out['repeats']}; "
          f"load average {load[0][0]:.2f} -> {load[1][0]:.2f}; CPU bf16 units: {out['bf16_units']}")
    if "agreement" in out:
        a = out["agreement"]
        print(f"  identical weights, same batch: |loss difference| eval {a['eval_loss_difference']:.1e}, "
              f"train (same seed) {a['train_loss_difference']:.1e}")
    for title, rows in out["steps"].items():
        print_table(title, rows)
    if "levers" in out:
        print_table(f"each lever alone on today's step (fp32, batch {out.get('lever_batch', '?')})", out["levers"])
        print(f"    the cross-entropy alone (forward + backward on the logits): {out['cross_entropy_ms']:.0f} ms")
        print("  what is learned, against today's step (batch 2, same weights and seed, 3 steps):")
        for name, a in out["lever_agreement"].items():
            print(f"    {name:>24}: |loss difference| step 1 {a['first_loss_difference']:.1e}, step 3 "
                  f"{a['third_loss_difference']:.1e}; largest weight difference {a['max_weight_difference']:.1e} "
                  f"({a['max_relative_difference']:.1e} of its tensor's largest value)")


def parse_config(argv: list[str] | None) -> tuple[StepBenchConfig, bool]:
    p = command_parser("benchmarks.train_step", __doc__.split("\n\n")[0])
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
    same = ("repeats", "warmup", "threads", "levers", "lever_batch", "preset", "device", "peak_tflops")
    cfg = StepBenchConfig(**{k: getattr(a, k) for k in same}, reference=not a.no_reference, variants=variants,
                          batch_sizes=tuple(int(b) for b in a.batch_sizes.split(",") if b),
                          precisions=tuple(x for x in a.precisions.split(",") if x))
    return cfg, a.json


def main(argv: list[str] | None = None) -> int:
    cfg, as_json = parse_config(argv)
    # torch: once the options are parsed
    from benchmarks.reference import ReferenceMissing, missing_message
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
