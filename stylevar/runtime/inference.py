"""Inference-only preparation of a loaded model, in place (`prepare(model, InferenceConfig(...))`): BatchNorm folded
into the image encoders' convs, channels-last convolutions, the transformer's linears packed once in oneDNN's
layout on the CPU (`PackedLinear`), the bf16 precision (`bf16_parts`: what runs in bfloat16), precision "auto"
(`choose_precision`: bf16 where this CPU's packed bf16 products measure faster) and compiled blocks
(`stylevar.runtime.compile`). A prepared model cannot be saved (`prepared(model)` tells).
"""
from __future__ import annotations

import copy
import dataclasses
import time
import warnings
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from stylevar.utils.precision import PRECISIONS, check_precision  # noqa: F401 (PRECISIONS: re-exported)


@dataclass(frozen=True)
class InferenceConfig:
    precision: Literal["auto", "fp32", "bf16"] = "fp32"  # stylevar.utils.precision.PRECISIONS; auto: `settle_precision`
    fuse_batchnorm: bool = True
    channels_last: bool = True
    pack_linears: bool = True
    compile: bool = False
    compile_backend: str = "inductor"  # stylevar.runtime.compile.BACKENDS

    def __post_init__(self):
        check_precision(self.precision)  # a removed precision (int8) says why


def native_cpu_bf16() -> bool:
    """Whether this CPU computes bfloat16 matrix products natively (AVX512-BF16 or AMX)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def cpu_bf16_tiles() -> bool:
    """Whether this CPU has AMX tiles, on which bf16 convolutions outrun fp32's (`bf16_parts`)."""
    return bool(torch.cpu._is_amx_tile_supported())


def packing_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch has oneDNN's packed linears and, for bfloat16, whether this CPU can run them."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    return dtype != torch.bfloat16 or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def prepared(model: nn.Module) -> InferenceConfig | None:
    """The config a model was prepared with, or None for a plain model."""
    return getattr(model, "inference_config", None)


@torch.no_grad()
def fold_batchnorm(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """A conv computing conv followed by the eval-mode `bn` (running statistics)."""
    fused = copy.deepcopy(conv)
    inv_std = torch.rsqrt(bn.running_var + bn.eps)
    gamma = bn.weight if bn.weight is not None else torch.ones_like(inv_std)
    beta = bn.bias if bn.bias is not None else torch.zeros_like(inv_std)
    scale = gamma * inv_std
    fused.weight.copy_(conv.weight * scale.view(-1, 1, 1, 1))
    bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
    fused.bias = nn.Parameter((bias - bn.running_mean) * scale + beta, requires_grad=False)
    return fused


def fuse_conv_bn(module: nn.Module) -> int:
    """Fold every BatchNorm2d directly after a Conv2d (recursively) into the conv; returns how many were folded."""
    folded = 0
    children = list(module.named_children())
    for (name_a, a), (name_b, b) in zip(children, children[1:]):
        if isinstance(a, nn.Conv2d) and isinstance(b, nn.BatchNorm2d) and b.track_running_stats:
            setattr(module, name_a, fold_batchnorm(a, b))
            setattr(module, name_b, nn.Identity())
            folded += 1
    for _, child in module.named_children():
        folded += fuse_conv_bn(child)
    return folded


class PackedLinear(nn.Module):
    """A linear layer whose weight is packed once in oneDNN's layout (CPU only), in ``dtype``; not in the state dict.
    ``post_op``: oneDNN's (name, algorithm) applied to the output in the same call (`fuse_ffn_gelu`)."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.in_features, self.out_features, self.dtype = linear.in_features, linear.out_features, dtype
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach().to(dtype))
        self.bias = None if linear.bias is None else linear.bias.detach().to(dtype)
        self.post_op = ("none", "")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        op, algorithm = self.post_op
        return torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self.packed_weight, self.bias, op, [], algorithm)

    @staticmethod
    def check_move(fn) -> None:
        """`.to()`, `.half()` ... : the packed weight cannot follow, so a move off the CPU or to another dtype
        is refused with a clear error (StyleVAR asks before anything moves) instead of failing later."""
        probe = fn(torch.zeros(1))
        if probe.device.type != "cpu" or probe.dtype != torch.float32:
            raise ValueError(f"this model was prepared for CPU inference (packed linear layers) and cannot move to "
                             f"{probe.device.type}/{probe.dtype}: load it there and prepare it again")

    def _apply(self, fn, recurse: bool = True):
        self.check_move(fn)
        return self

    def extra_repr(self) -> str:
        fused = "" if self.post_op[0] == "none" else f", then {'_'.join(self.post_op)}"
        return f"in_features={self.in_features}, out_features={self.out_features}, dtype={self.dtype}, packed{fused}"


class InDtype(nn.Module):
    """``module`` with its weights in ``dtype``, run on inputs cast to ``dtype``; returns float32."""

    def __init__(self, module: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.module, self.dtype = module.to(dtype), dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x.to(self.dtype)).float()

    def check_move(self, fn) -> None:
        """A move may change the device, not the dtype the wrapped module runs in (StyleVAR asks first)."""
        if fn(torch.zeros(1, dtype=self.dtype)).dtype != self.dtype:
            raise ValueError(f"this model was prepared to run its convolutions in {self.dtype} and cannot change "
                             f"dtype: load it again and prepare it with the precision wanted")


AUTO_MARGIN = 1.15  # how many times faster than fp32's bf16's products must measure for "auto" to choose bf16
GPU_REASON = "GPU: fp32 weights, the device's autocast rules apply"
NO_NATIVE_REASON = "no native bfloat16 on this CPU"
ASKED_REASON = "asked for, not measured"
MEASURED_FLOP = 2e7  # each timed sample runs at least this much arithmetic (a narrow model's product is tiny)


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a model runs in ("fp32" or "bf16"), why, and the timings "auto" decided on."""

    precision: Literal["fp32", "bf16"]
    reason: str
    measured: dict[str, float] = field(default_factory=dict)  # seconds per product, by precision


def decide(native_bf16: bool, fp32_s: float | None, bf16_s: float | None,
           margin: float = AUTO_MARGIN) -> PrecisionChoice:
    """Precision "auto" on a CPU: bf16 only where it is native and its products measured at least ``margin``
    times as fast as fp32's (``fp32_s``, ``bf16_s``: seconds per product; None: not measured)."""
    if not native_bf16:
        return PrecisionChoice("fp32", NO_NATIVE_REASON)
    if fp32_s is None or bf16_s is None:
        return PrecisionChoice("fp32", "bf16 products could not be measured here (no packed bf16 in this torch)")
    measured, speedup = {"fp32": fp32_s, "bf16": bf16_s}, fp32_s / bf16_s
    said = f"bf16 products run at {speedup:.2f}x fp32's speed on this CPU, measured at load"
    if speedup >= margin:
        return PrecisionChoice("bf16", said, measured)
    return PrecisionChoice("fp32", f"{said}; bf16 needs {margin:.2f}x", measured)


@torch.no_grad()
def time_products(in_features: int, out_features: int, rows: int = 64, repeats: int = 5,
                  warmup: int = 2) -> dict[str, float]:
    """Seconds per product of ``rows`` x ``in_features`` -> ``out_features`` through a `PackedLinear` in fp32 and
    in bf16: the best of ``repeats`` after ``warmup`` turns, the two alternating (random weights from a generator
    of their own: torch's global random state is left as it was)."""
    gen = torch.Generator().manual_seed(0)
    linear = nn.utils.skip_init(nn.Linear, in_features, out_features)
    linear.weight.normal_(0.0, in_features ** -0.5, generator=gen)
    linear.bias.zero_()
    x_RC = torch.randn(rows, in_features, generator=gen)
    packed = {"fp32": PackedLinear(linear, torch.float32), "bf16": PackedLinear(linear, torch.bfloat16)}
    calls = max(1, int(MEASURED_FLOP // (2 * rows * in_features * out_features)))
    best = dict.fromkeys(packed, float("inf"))
    for turn in range(warmup + repeats):
        for name, layer in packed.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                layer(x_RC)
            if turn >= warmup:
                best[name] = min(best[name], (time.perf_counter() - t0) / calls)
    return best


def choose_precision(model_or_width, device: torch.device | str | None = None,
                     margin: float = AUTO_MARGIN) -> PrecisionChoice:
    """What precision "auto" runs for a StyleVAR (or a transformer width C) on ``device`` (default: the model's):
    off the CPU fp32 (the GPU path as it is); on the CPU `decide` on its FFN's first product (C -> 4C) timed here."""
    if isinstance(model_or_width, int):
        in_features, out_features = model_or_width, 4 * model_or_width
    else:
        fc1 = model_or_width.blocks[0].ffn.fc1
        in_features, out_features = fc1.in_features, fc1.out_features
        device = model_or_width.pos_1LC.device if device is None else device
    if torch.device(device or "cpu").type != "cpu":
        return PrecisionChoice("fp32", GPU_REASON)
    native = native_cpu_bf16()
    if not (native and packing_available(torch.bfloat16)):  # bf16's packing implies fp32's
        return decide(native, None, None, margin)
    seconds = time_products(in_features, out_features)
    return decide(True, seconds["fp32"], seconds["bf16"], margin)


def settle_precision(model, cfg: InferenceConfig) -> InferenceConfig:
    """``cfg`` with its precision settled for ``model`` on its device ("auto": `choose_precision`), the choice and
    its reason kept on the model (`precision_of`). A prepared model is refused: its precision is set."""
    if prepared(model) is not None:
        raise ValueError(f"this model was already prepared ({prepared(model)})")
    if cfg.precision == "auto":
        model.precision_choice = choose_precision(model)
    else:
        model.precision_choice = PrecisionChoice(cfg.precision, ASKED_REASON)
    return dataclasses.replace(cfg, precision=model.precision_choice.precision)


def precision_of(model) -> PrecisionChoice:
    """The precision a model runs in and why: its settled choice (`prepare` settles it), else fp32."""
    return getattr(model, "precision_choice", None) or PrecisionChoice("fp32", "the model as loaded")


# the linear layers of each block that run at every scale of the sampling loop (and the model's head)
LOOP_LINEARS = ("attn.q_guide", "attn.kv_target", "attn.proj", "ffn.fc1", "ffn.fc2")


def replace_linears(model, make) -> None:
    """Every loop linear of every block, and the head, replaced by ``make(linear)``."""
    for owner, name in [(blk, n) for blk in model.blocks for n in LOOP_LINEARS] + [(model, "head")]:
        parent, _, attr = name.rpartition(".")
        holder = owner.get_submodule(parent) if parent else owner
        setattr(holder, attr, make(getattr(holder, attr)))


def fuse_ffn_gelu(model) -> None:
    """Each block's tanh GELU run inside its packed first FFN product: one pass over the hidden activations fewer,
    the same values within float rounding."""
    for blk in model.blocks:  # after `replace_linears`: every fc1 is packed, every act the FFN's own tanh GELU
        blk.ffn.fc1.post_op, blk.ffn.act = ("gelu", "tanh"), nn.Identity()


# the parts of a model that precision "bf16" may run in bfloat16 (`bf16_parts` says which do where)
BF16_PARTS = ("loop", "image_encoders", "tokenizer_decoder", "tokenizer_encoder")


def bf16_parts(tiles: bool) -> frozenset[str]:
    """The parts (`BF16_PARTS`) that precision "bf16" runs in bfloat16; the tokenizer's decoder only with AMX
    ``tiles`` (`cpu_bf16_tiles`), its encoder never (an image's tokens must not depend on the path)."""
    return frozenset(BF16_PARTS[:3 if tiles else 2])


def run_bf16(model, parts: frozenset[str]) -> None:
    """``parts`` (`BF16_PARTS`) of a model set to run in bfloat16, each returning float32 (the quantizer stays
    float32); the loop gets its autocast dtype here, its linears are packed by `prepare`."""
    bf16, tok = torch.bfloat16, model.tokenizer
    if "loop" in parts:
        model.loop_autocast_dtype = bf16
    if "image_encoders" in parts:
        model.style_encoder = InDtype(model.style_encoder, bf16)
        model.content_encoder = InDtype(model.content_encoder, bf16)
    if "tokenizer_decoder" in parts:
        tok.post_quant_conv, tok.decoder = InDtype(tok.post_quant_conv, bf16), InDtype(tok.decoder, bf16)
    if "tokenizer_encoder" in parts:
        tok.encoder, tok.quant_conv = InDtype(tok.encoder, bf16), InDtype(tok.quant_conv, bf16)


@torch.no_grad()
def prepare(model, cfg: InferenceConfig = InferenceConfig(), *, parts: frozenset[str] | None = None):
    """Make a StyleVAR (with its tokenizer) faster for inference, in place (module doc). Returns it. ``parts``:
    under precision "bf16", the parts that run in bfloat16 instead of `bf16_parts`' choice (for measurements)."""
    if prepared(model) is not None:
        raise ValueError(f"this model was already prepared ({prepared(model)})")
    if cfg.precision == "auto" or not hasattr(model, "precision_choice"):  # kept when settled already
        cfg = settle_precision(model, cfg)
    model.eval().requires_grad_(False)
    on_cpu = model.pos_1LC.device.type == "cpu"
    if cfg.fuse_batchnorm:
        for enc in (model.style_encoder, model.content_encoder):
            fuse_conv_bn(enc)
    if cfg.channels_last:
        for part in (model.tokenizer, model.style_encoder, model.content_encoder):
            part.to(memory_format=torch.channels_last)
    if cfg.precision == "bf16":
        if on_cpu and not native_cpu_bf16():
            warnings.warn("precision 'bf16': this CPU has no native bfloat16 arithmetic (AVX512-BF16 or "
                          "AMX); bf16 is emulated here and slower than 'fp32'", RuntimeWarning, stacklevel=2)
        parts = bf16_parts(on_cpu and cpu_bf16_tiles()) if parts is None else parts
        run_bf16(model, parts)
    dtype = torch.bfloat16 if cfg.precision == "bf16" and "loop" in parts else torch.float32
    if on_cpu and cfg.pack_linears and not cfg.compile and packing_available(dtype):
        replace_linears(model, lambda lin: PackedLinear(lin, dtype))
        fuse_ffn_gelu(model)
    elif dtype == torch.bfloat16:
        model.blocks.to(dtype)
        model.head.to(dtype)
    if cfg.compile:
        from stylevar.runtime.compile import compile_blocks

        compile_blocks(model, cfg.compile_backend)
    model.inference_config = cfg
    return model


def prepare_for_serving(model, cfg: InferenceConfig = InferenceConfig()) -> bool:
    """`prepare` as the service and the CLI run it: the precision settled first (`settle_precision`), then on the
    CPU always, elsewhere for bf16 or compilation; whether it prepared."""
    cfg = settle_precision(model, cfg)
    if model.pos_1LC.device.type == "cpu" or cfg.compile or cfg.precision != "fp32":
        prepare(model, cfg)
        return True
    return False
