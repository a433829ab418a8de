"""CPU inference, stage by stage, on the reference-shaped configuration (`benchmarks.reference`), random weights.

Per batch size: median ms per image of each stage (STAGES) for the plain model and a prepared copy per precision,
the models taking turns, and token agreement with fp32. `--fast`, `--reference`, `--repeat-style` and `--model`
add rows (see their help).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys
from collections.abc import Container
from dataclasses import dataclass
from typing import TYPE_CHECKING

from benchmarks.harness import command_parser, serving_process, time_turns, timing_arguments

if TYPE_CHECKING:
    import torch

# the stages of one image-to-image call, in the order they are timed: two VQ-VAE encodes, the two ResNet-18 encoders,
# all of `StyleVAR.condition`, the coarse-to-fine loop (top-k 900 / top-p 0.96), the final decode, `generate` whole
STAGES = ("encode", "encoders", "condition", "loop", "decode", "total")


@dataclass(frozen=True)
class StageBenchConfig:
    batch_sizes: tuple[int, ...] = (1, 4)
    repeats: int = 7
    warmup: int = 2
    threads: int = 2
    precisions: tuple[str, ...] = ("fp32",)  # prepared models timed beside the plain one
    reference: bool = False  # time the public reference too, at identical weights (its checkout on PYTHONPATH)
    agreement_seeds: int = 8
    seed: int = 0
    fast: bool = False  # also time the prepared fp32 model with fast sampling (row "fp32 fast")
    fast_keep: float | None = None  # its plan's keep fraction; None: the model's plan's
    fast_min_tokens: int | None = None  # its plan's smallest merged scale; None: the model's plan's
    repeat_style: bool = False  # one style for every row; each model also through the pipeline's condition cache
    model_dir: str | None = None  # a model directory in place of the random reference-shaped model


def build(cfg: StageBenchConfig, state: tuple[dict, dict] | None = None):
    """The plain reference-shaped model: random weights (seed `cfg.seed`) or the reference's state dicts loaded."""
    from benchmarks.reference import reference_shaped, reference_weights
    from stylevar.pipelines.pipeline import StylePipeline

    if cfg.model_dir is not None:
        return StylePipeline.from_pretrained(cfg.model_dir, device="cpu", autocast_dtype=None, threads="torch").model
    if state is None:
        return StylePipeline.random(reference_shaped(), seed=cfg.seed).model.eval()
    return reference_weights(*state).eval()


def prepared_copy(plain, precision: str):
    """A copy of the plain model, prepared for inference (`stylevar.runtime.inference.prepare`) at ``precision``."""
    from stylevar.runtime.inference import InferenceConfig, prepare

    return prepare(copy.deepcopy(plain), InferenceConfig(precision=precision))


FAST = "fp32 fast"  # the row of the prepared fp32 model sampling with `fast=True`


def stage_fns(model, content: torch.Tensor, style: torch.Tensor, fast: bool = False) -> dict:
    """One call of each stage (STAGES) of this project's model; ``fast``: the loop and total with fast sampling."""
    from stylevar.models.encoders import pooled
    from stylevar.config import GenerationConfig
    from stylevar.models.sampling import make_generators

    batch, tok, alpha_K = content.shape[0], model.tokenizer, model.blend_alphas()
    cond = model.condition(content, style)
    f_hat, _ = model.sample_tokens(cond, make_generators(0, batch, content.device), alpha_K)
    return {
        "encode": lambda: (tok.encode(content), tok.encode(style)),
        "encoders": lambda: (pooled(model.style_encoder, style), pooled(model.content_encoder, content)),
        "condition": lambda: model.condition(content, style),
        "loop": lambda: model.sample_tokens(cond, make_generators(0, batch, content.device), alpha_K,
                                               GenerationConfig(fast=fast)),
        "decode": lambda: tok.decode_fhat(f_hat),
        "total": lambda: model.generate(content, style, seed=0, fast=fast),
    }


def cached_stage_fns(model, content: torch.Tensor, style: torch.Tensor) -> dict:
    """`condition` and `total` through a pipeline's condition cache (`StylePipeline.condition`), each call with new
    contents (the batch moved by one more pixel, as a folder run's next batch) and the style of the first call."""
    import itertools

    from stylevar.pipelines.pipeline import StylePipeline

    pipe, shifts = StylePipeline.from_models(model), itertools.count(1)

    def fresh() -> torch.Tensor:
        return content.roll(next(shifts), -1)

    return {"condition": lambda: pipe.condition(fresh(), style),
            "total": lambda: model.generate(c := fresh(), style, seed=0, cond=pipe.condition(c, style))}


def time_stages(models: dict, batch: int, cfg: StageBenchConfig, reference=None) -> dict[str, dict[str, float]]:
    """Median ms per image of every stage for each model, the models' calls taking turns; ``reference``'s
    models (`benchmarks.reference`) in the same turns, its loop being its total less its other stages."""
    from benchmarks.reference import images, reference_stage_fns

    size = next(iter(models.values())).tokenizer.cfg.image_size
    content, style = images(batch, size, cfg.seed + batch)
    style = style[:1].expand_as(content).contiguous() if cfg.repeat_style else style
    fns = {name: stage_fns(m, content, style, fast=name == FAST) for name, m in models.items()}
    if cfg.repeat_style:
        fns.update({f"{name} cached": cached_stage_fns(m, content, style) for name, m in models.items() if name != FAST})
    if reference is not None:
        fns = {"reference": reference_stage_fns(reference, content, style), **fns}
    out = time_turns(fns, batch, cfg.repeats, cfg.warmup, STAGES)
    if reference is not None:
        ref = out["reference"]
        ref["loop"] = ref["total"] - ref["encode"] - ref["encoders"] - ref["decode"]
    return out


def equal_tokens(base, others: dict, size: int, seeds: int, fast: Container[str] = ()) -> tuple[dict, list[int]]:
    """Per scale, how many of each model's sampled tokens equal ``base``'s over ``seeds`` images (the same images and
    seeds; the models named in ``fast`` sample fast), and how many tokens there are."""
    import torch

    from benchmarks.reference import images

    equal: dict[str, list[list[int]]] = {name: [] for name in others}
    totals: list[list[int]] = []
    with torch.inference_mode():
        for s in range(seeds):
            content, style = images(1, size, 1000 + s)
            want = base.generate_with_indices(content, style, seed=s).indices
            totals.append([i.numel() for i in want])
            for name, m in others.items():
                got = m.generate_with_indices(content, style, seed=s, fast=name in fast).indices
                equal[name].append([int((a == b).sum()) for a, b in zip(want, got)])
    return {name: [sum(k) for k in zip(*e)] for name, e in equal.items()}, [sum(k) for k in zip(*totals)]


def greedy_difference(reference, model) -> float:
    """Largest pixel difference ([0, 1]) of the reference's and this model's greedy images at identical weights."""
    from benchmarks.reference import images, reference_generate

    content, style = images(1, model.tokenizer.cfg.image_size, 7)
    ours = model.generate(content, style, top_k=1, seed=0)
    theirs = reference_generate(reference, content, style, seed=0, top_k=1, top_p=0.0)
    return float((ours - theirs).abs().max())


def measure(cfg: StageBenchConfig, reference=None) -> dict:
    """Every figure of one run: stage times per batch size, token agreement, the greedy difference to ``reference``."""
    import torch

    plain = build(cfg, None if reference is None else (reference.vae.state_dict(), reference.model.state_dict()))
    models = {"plain": plain, **{x: prepared_copy(plain, x) for x in cfg.precisions}}
    if cfg.fast:
        models[FAST] = models["fp32"] if "fp32" in models else prepared_copy(plain, "fp32")
        plan = models[FAST].fast_sampling
        models[FAST].fast_sampling = dataclasses.replace(
            plan, keep=plan.keep if cfg.fast_keep is None else cfg.fast_keep,
            min_tokens=plan.min_tokens if cfg.fast_min_tokens is None else cfg.fast_min_tokens)
    config = cfg.model_dir or "reference-shaped d8, 160 px, 8 scales (255 tokens), V 4096"
    out = {"config": config + ("; one style a batch" if cfg.repeat_style else ""), "threads": cfg.threads,
           "repeats": cfg.repeats, "load": os.getloadavg()[0], "stages_ms_per_image": {}}
    with torch.inference_mode():
        if reference is not None:
            out["reference_greedy_max_pixel_difference"] = greedy_difference(reference, plain)
        for B in cfg.batch_sizes:
            out["stages_ms_per_image"][B] = time_stages(models, B, cfg, reference)
        others = {x: models[x] for x in cfg.precisions if x != "fp32"} | ({FAST: models[FAST]} if cfg.fast else {})
        equal, total = equal_tokens(plain, others, plain.tokenizer.cfg.image_size, cfg.agreement_seeds, {FAST})
        out["token_agreement_with_fp32"] = {x: sum(e) / sum(total) for x, e in equal.items()}
        if cfg.fast:
            out["fast_plan"] = dataclasses.asdict(models[FAST].fast_sampling)
    out["load_after"] = os.getloadavg()[0]
    return out


def print_report(out: dict, cfg: StageBenchConfig) -> None:
    """The figures of `measure` as a table, with the ratio to the reference (when measured) per batch size."""
    print(f"{out['config']}; {cfg.threads} threads; median of {cfg.repeats}; load {out['load']:.2f} -> "
          f"{out['load_after']:.2f}")
    if "reference_greedy_max_pixel_difference" in out:
        print(f"  identical weights: greedy images of the reference and this project differ by at most "
              f"{out['reference_greedy_max_pixel_difference']:.2e}")
    for B, per_model in out["stages_ms_per_image"].items():
        for name, st in per_model.items():
            cells = "  ".join(f"{k} {st[k]:7.1f}" if k in st else f"{k} {'-':>7}" for k in STAGES)
            print(f"  batch {B} {name:>9}: ms/image  {cells}")
        if "reference" not in per_model:
            continue
        ref = per_model["reference"]["total"]
        print(f"    vs the reference ({ref:.0f} ms/image, measured in the same turns): "
              + ", ".join(f"{n} {ref / st['total']:.2f}x faster" for n, st in per_model.items() if n != "reference"))
    if "fast_plan" in out:
        plan = out["fast_plan"]
        print(f"  {FAST}: fast sampling, {plan['keep']:g} of the 2 x 2 groups kept on every scale of at least "
              f"{plan['min_tokens']} positions")
    for x, agreement in out["token_agreement_with_fp32"].items():
        print(f"  {x}: token agreement with fp32 (same seeds, {cfg.agreement_seeds} images): {100 * agreement:.2f}%")


def parse_config(argv: list[str] | None) -> tuple[StageBenchConfig, bool]:
    """The command line as a `StageBenchConfig`, and whether to print JSON."""
    p = command_parser("benchmarks.cpu_pipeline", __doc__.split("\n\n")[0])
    timing_arguments(p, repeats=7, warmup=2)
    p.add_argument("--precisions", default="fp32",
                   help="comma-separated prepared models to time beside the plain one: fp32, bf16")
    p.add_argument("--reference", action="store_true",
                   help="also time the public reference (a checkout of it on PYTHONPATH), at identical weights")
    p.add_argument("--agreement-seeds", type=int, default=8,
                   help="images whose tokens are compared with the fp32 model's (same seeds)")
    p.add_argument("--fast", action="store_true", help="also time the prepared fp32 model with fast sampling")
    p.add_argument("--fast-keep", type=float, default=None, metavar="F",
                   help="fast sampling's fraction of 2 x 2 groups computed one by one (default: the model's plan's)")
    p.add_argument("--fast-min-tokens", type=int, default=None, metavar="N",
                   help="fast sampling's smallest merged scale, in positions (default: the model's plan's)")
    p.add_argument("--repeat-style", action="store_true",
                   help="one style for every row; each model also with its conditions through the pipeline's cache")
    p.add_argument("--model", default=None, metavar="DIR",
                   help="a model directory to time (e.g. stylevar/assets/demo) in place of the reference-shaped one")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    a = p.parse_args(argv)
    if a.model and a.reference:
        p.error("--model: the reference is timed at the reference-shaped configuration only")
    from stylevar.utils.precision import precision_error

    precisions = tuple(x for x in a.precisions.split(",") if x)
    for x in precisions:
        if precision_error(x):  # a removed one (int8) says why
            p.error(f"--precisions: {precision_error(x)}")
    cfg = StageBenchConfig(batch_sizes=tuple(int(b) for b in a.batch_sizes.split(",")), repeats=a.repeats,
                           warmup=a.warmup, threads=a.threads, precisions=precisions, reference=a.reference,
                           agreement_seeds=a.agreement_seeds,
                           fast=a.fast or a.fast_keep is not None or a.fast_min_tokens is not None,
                           fast_keep=a.fast_keep, fast_min_tokens=a.fast_min_tokens, repeat_style=a.repeat_style,
                           model_dir=a.model)
    return cfg, a.json


def main(argv: list[str] | None = None) -> int:
    cfg, as_json = parse_config(argv)
    serving_process(cfg.threads)
    reference = None
    if cfg.reference:
        from benchmarks.reference import ReferenceMissing, build_reference, missing_message

        try:
            reference = build_reference(cfg.seed)
        except ReferenceMissing as e:
            print(f"cpu_pipeline: {missing_message(e)}", file=sys.stderr)
            return 2
    out = measure(cfg, reference)
    if as_json:
        print(json.dumps(out))
    else:
        print_report(out, cfg)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
