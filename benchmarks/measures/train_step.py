"""The measurements of `python -m benchmarks.train_step` (its docstring says what is timed; its variants and
settings: `benchmarks.train_step_config`): the reference's step and this project's, built on identical
weights, timed taking turns, and what each lever changes in what is learned."""
from __future__ import annotations

import copy
import os
import sys
import time
import types
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.side_by_side import images, reference_shaped, reference_weights, take_turns
from benchmarks.train_step_config import LEVERS, TODAY, VARIANTS, Levers, StepBenchConfig
from stylevar.runtime.bench import flops_of as step_flops
from stylevar.runtime.bench import sync
from stylevar.config import presets
from stylevar.runtime.inference import native_cpu_bf16
from training.parts.optim import ScheduleConfig, make_adamw, two_level_scheduler
from stylevar.utils.precision import autocast, make_grad_scaler
from training.parts.step import clip_and_step
from stylevar.runtime.compile import compile_blocks
from training.parts.sft_model import channels_last
from training.parts.sft_objective import SFTObjective
from training.parts.token_inputs import encode_triplets

LABEL_SMOOTHING, LR, WEIGHT_DECAY, MAX_GRAD_NORM = 0.1, 1e-4, 0.05, 2.0
# the reference's no-weight-decay name fragments (train/train_sft.py's filter_params call)
REFERENCE_NO_DECAY = ("cls_token", "start_token", "task_token", "cfg_uncond", "pos_embed", "pos_1LC", "pos_start",
                      "start_pos", "lvl_embed", "gamma", "beta", "ada_gss", "moe_bias", "scale_mul")


# ------------------------------------------------------------------------------------------ the reference
def import_reference_trainer():
    """The reference's `StyleVARTrainer` and `AmpOptimizer`, with the stand-ins the module doc lists."""
    from benchmarks.measures.reference_pipeline import import_reference

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
    vae, q, model = bundle.vae, bundle.vae.quantize, bundle.model
    with torch.no_grad():
        gt = vae.img_to_idxBl(batch["target"])
        style = q.msBllist_to_BlCvae(vae.img_to_idxBl(batch["style"]))
        content = q.msBllist_to_BlCvae(vae.img_to_idxBl(batch["content"]))
        torch.manual_seed(seed)
        logits = model(q.idxBl_to_var_input(gt), style, content, batch["style"], batch["content"])
        return float(F.cross_entropy(logits.flatten(0, 1), torch.cat(gt, 1).flatten(), label_smoothing=LABEL_SMOOTHING))


# ------------------------------------------------------------------------------------------ ours
def our_batch(model, batch: dict[str, torch.Tensor], levers: Levers) -> dict[str, torch.Tensor]:
    """``batch`` as training.sft feeds it: with the token cache, the token maps it holds (made once, here)."""
    out = dict(batch)
    if levers.token_cache:
        indices_3BL = encode_triplets(model.tokenizer, batch["target"], batch["style"], batch["content"])[1]
        out["tokens_B3L"] = indices_3BL.to(torch.int16)  # as stored
    return out


def our_step(model, batch: dict[str, torch.Tensor], levers: Levers, precision: str) -> Callable[[], float]:
    """One optimizer step of training.sft's objective on ``batch`` (the model in train mode)."""
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
    objective = SFTObjective(model, label_smoothing=LABEL_SMOOTHING, alpha_jitter=0.0, seed=0)
    with torch.no_grad():
        torch.manual_seed(seed)
        return float(objective(batch)[0])


def triplets(batch: int, size: int, seed: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    content, style = images(batch, size, seed)
    target, _ = images(batch, size, seed + 10_000)
    return {"content": content.to(device), "style": style.to(device), "target": target.to(device)}


# ------------------------------------------------------------------------------------------ measuring
def build_models(cfg: StepBenchConfig):
    """(reference bundle or None, our model): identical weights when the reference is built."""
    from stylevar.pipelines.pipeline import StylePipeline

    if not cfg.reference:
        shapes = reference_shaped() if cfg.preset == "reference" else presets(cfg.preset)
        return None, StylePipeline.random(shapes, seed=cfg.seed).model
    from benchmarks.measures.reference_pipeline import build_reference

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
    """What is learned, per lever (``names``: of LEVERS and VARIANTS; default all): the first and third step's
    loss and the largest weight difference after 3 steps, each against today's step from the same weights
    on the same batch (fp32)."""
    batch = triplets(batch_size, ours.tokenizer.cfg.image_size, cfg.seed + 7, cfg.device)
    every = {**LEVERS, **VARIANTS}
    runs = {}
    for name, levers in {"today": TODAY, **{n: every[n] for n in (names or every) if n != "today"}}.items():
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
    return lambda: (fn(), sync(torch.device(device)))


def time_steps(fns: dict[str, Callable[[], object]], repeats: int, warmup: int) -> dict[str, dict[str, float]]:
    """Median wall-clock and CPU seconds (this process, all its threads) of each function's calls, the functions
    taking turns call by call after ``warmup`` untimed rounds (`side_by_side.take_turns`). On a shared machine
    the CPU time is the steadier measure of the work (run with OMP_WAIT_POLICY=PASSIVE, or idle OpenMP threads
    spinning count as work)."""
    medians = take_turns(fns, repeats, warmup, (time.perf_counter, time.process_time))
    return {name: {"wall": wall, "cpu": cpu} for name, (wall, cpu) in medians.items()}


def time_variants(bundle, ours, variants: dict[str, Levers], batch_size: int, precision: str,
                  cfg: StepBenchConfig) -> dict[str, dict[str, float]]:
    """ms per step and samples/s of the reference (when built) and each variant of ours, taking turns."""
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
            flops = step_flops(steps[name])
            out[name]["tflop_per_step"] = flops / 1e12
            out[name]["mfu"] = flops / (out[name]["ms_per_step"] / 1000) / (cfg.peak_tflops * 1e12)
    return out


def cross_entropy_ms(batch: int, tokens: int, vocab: int, repeats: int) -> float:
    """Median ms of the loss alone, forward and backward, on logits of the step's shape (B * L, V) float32:
    the most a fused or chunked cross-entropy could save (the head's matrix products stay either way)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(batch * tokens, vocab, generator=g).requires_grad_()
    gt = torch.randint(0, vocab, (batch * tokens,), generator=g)

    def loss() -> None:
        F.cross_entropy(logits, gt, label_smoothing=LABEL_SMOOTHING).backward()
        logits.grad = None
    return 1000 * time_steps({"ce": loss}, repeats, 1)["ce"]["wall"]


def measure(cfg: StepBenchConfig) -> dict:
    bundle, ours = build_models(cfg)
    out: dict = {"config": "reference-shaped d8, 160 px, 8 scales (255 tokens), V 4096" if cfg.preset == "reference"
                 else f"preset {cfg.preset}", "threads": cfg.threads, "repeats": cfg.repeats,
                 "device": cfg.device, "loadavg_before": os.getloadavg(), "bf16_units": native_cpu_bf16(),
                 "steps": {}}
    if bundle is not None:
        out["agreement"] = agreement(bundle, ours, cfg)
    for precision in cfg.precisions:
        for B in cfg.batch_sizes:
            variants = {name: VARIANTS[name] for name in cfg.variants}
            out["steps"][f"{precision} batch {B}"] = time_variants(bundle, ours, variants, B, precision, cfg)
    if cfg.levers:
        variants = {"today": TODAY, **LEVERS, **{k: v for k, v in VARIANTS.items() if k != "today"}}
        out["lever_agreement"] = lever_agreement(ours, 2, cfg)
        out["lever_batch"] = cfg.lever_batch
        out["levers"] = time_variants(bundle, ours, variants, cfg.lever_batch, "fp32", cfg)
        out["cross_entropy_ms"] = cross_entropy_ms(cfg.lever_batch, ours.cfg.num_tokens, ours.cfg.vocab_size,
                                                   cfg.repeats)
    out["loadavg_after"] = os.getloadavg()
    return out


# ------------------------------------------------------------------------------------------ report
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
