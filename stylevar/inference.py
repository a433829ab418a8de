"""Inference-only preparation of a loaded model: CPU speed settings, opt-in int8 and compilation.

`prepare(model, InferenceConfig(...))` changes a model in place for serving; nothing here is used by
training, and a plain model (never prepared) is the exact path the conformance tests check.

- `fuse_batchnorm`: each eval-mode BatchNorm of the ResNet-18 image encoders is folded into the conv
  before it (one conv instead of conv + normalisation; equal up to float rounding).
- `channels_last`: the convolutional parts (tokenizer, image encoders) hold their weights in NHWC, the
  layout oneDNN's CPU convolutions work in, so no layout conversion runs around every conv.
- `precision="int8"`: dynamic int8 quantisation (weights int8 per tensor, activations quantised per
  call) of the transformer's linear layers that dominate the sampling loop: the guide queries, the
  attention output projection, both FFN layers and the head. Tokens then differ from fp32's at some
  positions; benchmarks/cpu_pipeline.py measures how many and how much faster it is.
- `compile`: `torch.compile` of every block (stylevar.transformer.fast); it pays off in a long-running
  service (compiled once, at warm-up), not for one-off calls.
- `threads`: torch's intra-op thread count (None: leave it).

A prepared model cannot be saved as a model directory (its state dict no longer has the published
layout): `prepared(model)` tells, and `StylePipeline.save_pretrained` refuses.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

PRECISIONS = ("fp32", "int8")


@dataclass(frozen=True)
class InferenceConfig:
    precision: Literal["fp32", "int8"] = "fp32"
    fuse_batchnorm: bool = True
    channels_last: bool = True
    compile: bool = False
    threads: int | None = None

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, not {self.precision!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, not {self.threads}")


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
    """Fold every BatchNorm2d that directly follows a Conv2d among a module's children (recursively;
    torchvision's BasicBlock order conv1/bn1, conv2/bn2 and downsample's Sequential(conv, bn)). The
    BatchNorm becomes Identity. Returns how many were folded."""
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


def _quantize_linears(module: nn.Module, names: tuple[str, ...]) -> None:
    from torch.ao.quantization import quantize_dynamic

    for name in names:
        parent, _, attr = name.rpartition(".")
        owner = module.get_submodule(parent) if parent else module
        lin = getattr(owner, attr)
        setattr(owner, attr, quantize_dynamic(nn.Sequential(lin), {nn.Linear}, dtype=torch.qint8)[0])


INT8_LINEARS = ("attn.q_guide", "attn.proj", "ffn.fc1", "ffn.fc2")  # per block; kv_target is read as a weight


@torch.no_grad()
def prepare(model, cfg: InferenceConfig = InferenceConfig()):
    """Make a StyleVAR (with its tokenizer) faster for inference, in place (module doc). Returns it."""
    if prepared(model) is not None:
        raise ValueError(f"this model was already prepared ({prepared(model)})")
    model.eval().requires_grad_(False)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    on_cpu = model.pos_1LC.device.type == "cpu"
    if cfg.fuse_batchnorm:
        for enc in (model.style_encoder, model.content_encoder):
            fuse_conv_bn(enc)
    if cfg.channels_last:
        for part in (model.tokenizer, model.style_encoder, model.content_encoder):
            part.to(memory_format=torch.channels_last)
    if cfg.precision == "int8":
        if not on_cpu:
            raise ValueError("precision 'int8' (dynamic quantisation) runs on the CPU only")
        for blk in model.blocks:
            _quantize_linears(blk, INT8_LINEARS)
        _quantize_linears(model, ("head",))
    if cfg.compile:
        from stylevar.transformer.fast import compile_model

        compile_model(model)
    model.inference_config = cfg
    return model
