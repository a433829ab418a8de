"""How close CPU inference comes to the machine's matrix-product peak, stage by stage.

Per stage of one image (the tokenizer encodes, the image encoders, each sampling scale, the decode) and for the
whole `generate` call: FLOPs (FlopCounterMode), median time per image (the models taking turns), and the fraction
of the dtype's peak, measured in the same run at its start and end (best of a conv, a packed linear and a GEMM).
The models are prepared copies (`stylevar.runtime.inference.prepare`) of a preset's shapes with random weights or
of a model directory (`--model`); the row "bf16 decoder switched" runs the tokenizer's decoder in the other dtype;
`--levers` adds the loop's other levers (`LEVERS`) and every row's token agreement with fp32, scale by scale.
"""
from __future__ import annotations

import copy
import itertools
import json
import os
import statistics
import time
from pathlib import Path

from benchmarks.harness import command_parser, emit, serving_process, take_turns

PEAK_KERNELS = ("conv", "packed_linear", "mm")
# the part of the model (stylevar.runtime.inference.BF16_PARTS) that each stage's arithmetic runs in
STAGE_PARTS = {"encode_content": "tokenizer_encoder", "encode_style": "tokenizer_encoder",
               "encoder_content": "image_encoders", "encoder_style": "image_encoders", "loop": "loop",
               "decode": "tokenizer_decoder"}
ALT = "bf16 decoder switched"  # bf16 with the tokenizer's decoder in the other dtype than bf16_parts' choice
# rows of --levers: the service's compiled blocks (Inductor); the blocks compiled with max-autotune's C++ GEMM templates
# on frozen weights; int8 weights on bf16 activations in the loop
LEVERS = {"fp32 compiled": frozenset(), "fp32 max-autotune": frozenset(), "int8 weights": frozenset({"loop"})}
AUTOTUNE = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN", "freezing": True}  # Inductor's options


def peak_kernels(dtype, repeats: int = 5) -> dict[str, float]:
    """GFLOP/s of each peak kernel (`PEAK_KERNELS`) in ``dtype``, at shapes large enough for the CPU to reach its
    rate (a tokenizer-like channels-last conv, a 1024-row packed linear, a 2048 GEMM), after a warm-up."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 128, 128, 128, generator=g).to(dtype, memory_format=torch.channels_last)
    w = torch.randn(128, 128, 3, 3, generator=g).div(35).to(dtype, memory_format=torch.channels_last)
    a, b = torch.randn(2048, 2048, generator=g).to(dtype), torch.randn(2048, 2048, generator=g).to(dtype)
    rows, lin_w = torch.randn(1024, 1280, generator=g).to(dtype), torch.randn(1280, 1280, generator=g).to(dtype)
    packed = torch.ops.mkldnn._reorder_linear_weight(lin_w)
    kernels = {"conv": (lambda: F.conv2d(x, w, padding=1), 2 * 128 * 128 * 9 * 128 * 128),
               "packed_linear": (lambda: torch.ops.mkldnn._linear_pointwise(rows, packed, None, "none", [], ""),
                                 2 * 1024 * 1280 * 1280),
               "mm": (lambda: torch.mm(a, b), 2 * 2048 ** 3)}
    with torch.inference_mode():
        medians = take_turns({name: fn for name, (fn, _) in kernels.items()}, repeats, 3)
    return {name: flops / medians[name][0] / 1e9 for name, (_, flops) in kernels.items()}


def machine_peaks() -> dict[str, dict[str, float]]:
    """`peak_kernels` per dtype (fp32, bf16)."""
    import torch

    return {d: peak_kernels(getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[d])) for d in ("fp32", "bf16")}


def rescale_to_peaks(out: dict, peaks: dict[str, dict[str, float]]) -> None:
    """``out``'s peaks raised to the best of theirs and ``peaks`` (measured again at the end of the run, so a slow
    start does not flatter the stages), its fractions of peak recomputed."""
    out["peak_gflops"] = {d: {k: max(v, peaks[d][k]) for k, v in ks.items()} for d, ks in out["peak_gflops"].items()}
    best = {d: max(k.values()) for d, k in out["peak_gflops"].items()}
    for table in out["batches"].values():
        for row in table.values():
            for cell in row.values():
                peak = max(best.values()) if cell["dtype"] == "best" else best[cell["dtype"]]
                cell["fraction_of_peak"] = cell["gflops"] / peak


class ScaleMarks:
    """While entered, a reading of ``clock`` each time the model's head runs (once per scale of the loop)."""

    def __init__(self, model, clock):
        self.model, self.clock, self.marks = model, clock, []

    def __enter__(self):
        self.handle = self.model.head.register_forward_hook(lambda *_: self.marks.append(self.clock()))
        return self

    def __exit__(self, *exc):
        self.handle.remove()

    def per_scale(self, start: float, end: float) -> list[float]:
        """The reading's increase over each scale (the loop's set-up in the first, its tail in the last)."""
        edges = [start, *self.marks[:-1], end]
        return [b - a for a, b in itertools.pairwise(edges)]


def stage_calls(model, content, style, skip=frozenset()) -> dict:
    """One call of each timed stage but ``skip``'s ("loop" also gives its per-scale split); decode: a random latent."""
    import torch

    from stylevar.models.encoders import pooled
    from stylevar.models.sampling import make_generators

    batch, tok, alpha_K = content.shape[0], model.tokenizer, model.blend_alphas()
    cond = None if "loop" in skip else model.condition(content, style)
    n = tok.latent_size
    f_hat = torch.randn(batch, tok.cfg.z_channels, n, n, generator=torch.Generator().manual_seed(0))

    def loop(clock=time.perf_counter):
        with ScaleMarks(model, clock) as marks:
            start = clock()
            model.sample_tokens(cond, make_generators(0, batch, content.device), alpha_K)
            return marks.per_scale(start, clock())

    calls = {"encode_content": lambda: tok.encode(content), "encode_style": lambda: tok.encode(style),
             "encoder_content": lambda: pooled(model.content_encoder, content),
             "encoder_style": lambda: pooled(model.style_encoder, style), "loop": loop,
             "decode": lambda: tok.decode_fhat(f_hat)}
    return {stage: call for stage, call in calls.items() if stage not in skip}


def count_flops(plain, content, style) -> dict[str, float]:
    """FLOPs of each stage, each scale ("loop k") and the whole `generate` ("total"), on the plain model."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    # the CPU's fused attention is not in torch's table; its FLOPs are those of the attention it computes
    cpu_sdpa = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu:
                lambda q, k, v, *_, out_shape=None, **__: sdpa_flop_count(q, k, v)}
    out = {}
    calls = {**stage_calls(plain, content, style), "total": lambda: plain.generate(content, style, seed=0)}
    for name, call in calls.items():
        with torch.inference_mode(), FlopCounterMode(display=False, custom_mapping=cpu_sdpa) as counter:
            result = call(counter.get_total_flops) if name == "loop" else call()
        out[name] = float(counter.get_total_flops())
        for k, flops in enumerate(result if name == "loop" else []):
            out[f"loop {k}"] = float(flops)
    return out


def time_models(models: dict, content, style, repeats: int, warmup: int, skip: dict) -> dict[str, dict[str, float]]:
    """Median seconds of each model's stages (and scales) but ``skip[name]``'s, the models taking turns."""
    import torch

    scales: dict[str, list[list[float]]] = {name: [] for name in models}  # the loop's split of each call

    def kept(name: str, stage: str, call):
        return (lambda: scales[name].append(call())) if stage == "loop" else call

    with torch.inference_mode():
        calls = {(name, stage): kept(name, stage, call) for name, m in models.items()
                 for stage, call in stage_calls(m, content, style, skip.get(name, ())).items()}
        medians = take_turns(calls, repeats, warmup)
    out: dict[str, dict[str, float]] = {name: {} for name in models}
    for (name, stage), (seconds,) in medians.items():
        out[name][stage] = seconds
        for k, per_scale in enumerate(zip(*scales[name][warmup:]) if stage == "loop" else ()):
            out[name][f"loop {k}"] = statistics.median(per_scale)
    return out


def build_models(preset: str, precisions: list[str], levers: bool = False,
                 model_dir: Path | None = None) -> tuple[object, dict, dict]:
    """The plain model (``model_dir``'s, else ``preset``'s shapes with random weights), its prepared copies by row
    name, and each row's bf16 parts (with bf16, an `ALT` decoder row; with ``levers``, the `LEVERS` rows)."""
    from stylevar.config import presets
    from stylevar.pipelines.pipeline import StylePipeline
    from stylevar.runtime.compile import compile_blocks
    from stylevar.runtime.inference import InferenceConfig, bf16_parts, cpu_bf16_tiles, prepare

    plain = (StylePipeline.from_pretrained(model_dir, device="cpu") if model_dir else
             StylePipeline.random(presets(preset), seed=0)).model.eval()
    rows = {}
    for precision in precisions:
        rows[precision] = frozenset() if precision == "fp32" else bf16_parts(cpu_bf16_tiles())
        if precision == "bf16":
            rows[ALT] = rows["bf16"] ^ {"tokenizer_decoder"}
    models = {name: prepare(copy.deepcopy(plain), InferenceConfig(precision="fp32" if name == "fp32" else "bf16"),
                            parts=None if name == "fp32" else parts) for name, parts in rows.items()}
    if levers:
        def fp32(**options):
            return prepare(copy.deepcopy(plain), InferenceConfig(precision="fp32", **options))

        models["fp32 compiled"] = fp32(compile=True)
        models["fp32 max-autotune"] = fp32(pack_linears=False)
        compile_blocks(models["fp32 max-autotune"], options=AUTOTUNE)  # autotuned at the first call (minutes)
        models["int8 weights"] = int8_weights(fp32(pack_linears=False))
        rows.update(LEVERS)
    return plain, models, rows


def int8_weights(model):
    """``model`` (prepared, linears unpacked) with every loop linear holding per-output-channel int8 weights, run on
    bfloat16 activations (torch's `_weight_int8pack_mm`, what weight-only int8 quantization calls on the CPU)."""
    import torch
    from torch import nn

    from stylevar.runtime.inference import replace_linears

    class Int8WeightLinear(nn.Module):
        def __init__(self, linear: nn.Linear):
            super().__init__()
            w_OI = linear.weight.detach().float()
            scale_O = w_OI.abs().amax(1).clamp_min(1e-12) / 127
            self.w_OI, self.scale_O = (w_OI / scale_O[:, None]).round().to(torch.int8), scale_O.to(torch.bfloat16)
            self.bias_O = None if linear.bias is None else linear.bias.detach().float()

        def forward(self, x_BLI: torch.Tensor) -> torch.Tensor:  # float32 out
            y = torch._weight_int8pack_mm(x_BLI.reshape(-1, x_BLI.shape[-1]).to(torch.bfloat16), self.w_OI,
                                          self.scale_O).float().reshape(*x_BLI.shape[:-1], -1)
            return y if self.bias_O is None else y + self.bias_O

    replace_linears(model, Int8WeightLinear)
    return model


def token_agreement(models: dict, size: int, seeds: int) -> dict[str, list[float]]:
    """Per row but fp32, the fraction of sampled tokens equal to the fp32 row's, scale by scale (same images, seeds)."""
    from benchmarks.cpu_pipeline import equal_tokens

    equal, total = equal_tokens(models["fp32"], {n: m for n, m in models.items() if n != "fp32"}, size, seeds)
    return {name: [e / t for e, t in zip(counts, total)] for name, counts in equal.items()}


def stage_dtype(stage: str, parts: frozenset[str]) -> str:
    part = "loop" if stage.startswith("loop") else STAGE_PARTS.get(stage)
    return "bf16" if part in parts else "fp32"


def measure(args) -> dict:
    """Every figure of one run (module doc)."""
    import torch

    serving_process(args.threads)
    peaks = machine_peaks()
    best = {d: max(k.values()) for d, k in peaks.items()}
    plain, models, rows = build_models(args.preset, args.precisions, args.levers, args.model)
    size = plain.tokenizer.cfg.image_size
    out = {"preset": None if args.model else args.preset, "model": args.model and str(args.model), "image_size": size,
           "threads": args.threads, "repeats": args.repeats, "load_before": os.getloadavg(), "peak_gflops": peaks,
           "bf16_parts": {n: sorted(p) for n, p in rows.items()}, "batches": {}}
    flops, same = {}, frozenset()
    if ALT in rows:
        same = frozenset(s for s in STAGE_PARTS if stage_dtype(s, rows[ALT]) == stage_dtype(s, rows["bf16"]))
        out["timed_once_for_both_bf16_rows"] = sorted(same)
    for batch in args.batch_sizes:
        g = torch.Generator().manual_seed(batch)
        content, style = (torch.rand(batch, 3, size, size, generator=g) * 2 - 1 for _ in range(2))
        # FLOPs per image do not depend on the batch: counted once, at the first batch size
        flops = flops or {k: v / batch for k, v in count_flops(plain, content, style).items()}
        seconds = time_models(models, content, style, args.repeats, args.warmup, {ALT: same})
        if ALT in seconds:  # its other stages are bf16's, module for module
            seconds[ALT] = {**{k: v for k, v in seconds["bf16"].items() if k.split()[0] in same},
                               **seconds[ALT]}
        table = {}
        for name, per in seconds.items():
            per["total"] = sum(per[stage] for stage in STAGE_PARTS)  # the rest of generate: its embeddings
            table[name] = {}
            for stage, s in per.items():
                dtype = "best" if stage == "total" else stage_dtype(stage, rows[name])
                peak = max(best.values()) if stage == "total" else best[dtype]
                rate = flops[stage] * batch / s / 1e9
                table[name][stage] = {"gflop": flops[stage] / 1e9, "ms": 1e3 * s / batch, "dtype": dtype,
                                      "gflops": rate, "fraction_of_peak": rate / peak}
        out["batches"][str(batch)] = table
        if args.json:  # each batch size's figures as soon as they are measured
            args.json.write_text(json.dumps({**out, "load_after": os.getloadavg()}, indent=1))
    if args.agreement_seeds and "fp32" in models:
        out["token_agreement_per_scale"] = token_agreement(models, size, args.agreement_seeds)
    rescale_to_peaks(out, machine_peaks())
    out["load_after"] = os.getloadavg()
    return out


def markdown(out: dict) -> str:
    """The peaks and, per batch size, one row per stage with each model's time and fraction of peak."""
    source = f"model {out['model']}" if out.get("model") else f"preset {out['preset']}"
    lines = [(f"{source}, {out['image_size']} px, {out['threads']} threads, median of {out['repeats']}; "
              f"load {out['load_before'][0]:.2f} -> {out['load_after'][0]:.2f}"), "",
             ("| peak GFLOP/s | " + " | ".join(PEAK_KERNELS) + " |"), "|---" * (len(PEAK_KERNELS) + 1) + "|"]
    lines += [f"| {d} | " + " | ".join(f"{k[n]:.1f}" for n in PEAK_KERNELS) + " |" for d, k in out["peak_gflops"].items()]
    for batch, table in out["batches"].items():
        names = list(table)
        first = table[names[0]]
        lines += ["", f"batch {batch} (per image)", "",
                  "| stage | GFLOP | " + " | ".join(f"{n} ms | {n} % peak" for n in names) + " |",
                  "|---" * (2 + 2 * len(names)) + "|"]
        for stage in first:
            cells = " | ".join(f"{table[n][stage]['ms']:.1f} | {100 * table[n][stage]['fraction_of_peak']:.1f} "
                               f"({table[n][stage]['dtype']})" for n in names)
            lines.append(f"| {stage} | {first[stage]['gflop']:.3f} | {cells} |")
    agreement = out.get("token_agreement_per_scale", {})
    if agreement:
        lines += ["", "token agreement with fp32, % per scale (coarse to fine)", ""]
        lines += [f"- {name}: " + ", ".join(f"{100 * a:.1f}" for a in per) for name, per in agreement.items()]
    return "\n".join(lines)


def parse_args(argv=None):
    p = command_parser("benchmarks.roofline", __doc__.splitlines()[0])
    p.add_argument("--preset", default="d20", help="stylevar.config preset (random weights)")
    p.add_argument("--model", type=Path, default=None, metavar="DIR",
                   help="a model directory, timed with its own weights, in place of --preset (e.g. the demo)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4], help="images per call, each timed")
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"],
                   help="prepared models timed side by side")
    p.add_argument("--threads", type=int, default=2, help="torch's CPU threads")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (their median is reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds before the timed ones")
    p.add_argument("--levers", action="store_true", help="also time the loop's other levers (LEVERS)")
    p.add_argument("--agreement-seeds", type=int, default=2,
                   help="images whose sampled tokens each row compares with fp32's, per scale (0: none)")
    p.add_argument("--json", type=Path, help="also write every figure here")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = measure(args)
    return emit(out, args.json, markdown(out))


if __name__ == "__main__":
    raise SystemExit(main())
