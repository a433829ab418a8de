"""The model an SFT run trains: the frozen tokenizer, the StyleVAR it starts from, its stochastic depth, and the
step's layouts (NHWC convolutions on the CPU, compiled blocks)."""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from stylevar.config import StyleVARConfig, VQVAEConfig
from stylevar.loaders.convert import load_stylevar, load_vqvae
from stylevar.loaders.model_dir import check_model_dir
from stylevar.models.tokenizer import MultiScaleVQVAE
from stylevar.models.transformer import StyleVAR
from stylevar.runtime.compile import compile_blocks
from training.parts.cli import SFT_COMPILE_MIN_STEPS
from training.parts.distributed import DistEnv
from training.parts.rng import seed_everything
from training.parts.presets import match_transformer, resize_tokenizer
from training.sft.var_init import init_from_var


def read_tokenizer(src: str, preset_cfg: VQVAEConfig, image_size: int | None) -> MultiScaleVQVAE:
    """The frozen tokenizer from a folder (RUN/final or a model directory) or a weights file (.pth/.safetensors)."""
    path = Path(src)
    if path.is_dir():
        vqvae = MultiScaleVQVAE.from_pretrained(path)
        if image_size is not None and image_size != vqvae.cfg.image_size:
            raise ValueError(f"--image-size {image_size} differs from the tokenizer's {vqvae.cfg.image_size}")
        return vqvae
    return load_vqvae(path, resize_tokenizer(preset_cfg, image_size))


def build_model(args: argparse.Namespace, tr_preset: StyleVARConfig, vqvae: MultiScaleVQVAE,
                log_lines: list[str]) -> tuple[StyleVAR, dict[str, Any] | None]:
    """A fresh, VAR-initialised or --init-loaded StyleVAR (seeded: the same on every rank)."""
    cfg = match_transformer(tr_preset, vqvae.cfg)
    summary = None
    seed_everything(args.seed)
    if args.init_var:
        model, summary = init_from_var(args.init_var, cfg, vqvae)
        log_lines.append(
            f"initialised from class-conditional VAR {args.init_var}: {len(summary['copied'])} tensors copied, "
            f"{len(summary['split'])} split into guide/target projections, {len(summary['dropped'])} dropped "
            f"({', '.join(summary['dropped'][:6])}), {len(summary['fresh'])} fresh, encoders {summary['encoders']}"
        )
    elif args.init:
        init = Path(args.init)
        if init.is_dir():
            check_model_dir(init)
            model = StyleVAR.from_pretrained(init, vqvae)
        else:
            model = load_stylevar(init, cfg, vqvae)
        log_lines.append(f"initialised from StyleVAR weights {args.init}")
        if args.add_variants:
            model = with_variants(model, args.add_variants)
            log_lines.append(f"variants added (zero-initialised, the same computation at step 0): {args.add_variants}")
    else:
        model = StyleVAR(cfg, vqvae)
        log_lines.append("transformer initialised from scratch")
    model.tokenizer.requires_grad_(False)
    if args.drop_path_rate is not None:
        set_drop_path_rate(model, args.drop_path_rate)
    return model, summary


VARIANT_MODULES = {"content_injection": "content_in", "colour_stats": "colour_in"}


def with_variants(model: StyleVAR, variants: list[str]) -> StyleVAR:
    """``model`` with opt-in variants on, their modules at zero (the model computes what it did)."""
    unknown = sorted(set(variants) - set(VARIANT_MODULES))
    if unknown:
        raise SystemExit(f"error: --add-variants: unknown {unknown} (known: {sorted(VARIANT_MODULES)})")
    grown = StyleVAR(dataclasses.replace(model.cfg, **{v: True for v in variants}), model.tokenizer)
    missing, unexpected = grown.load_state_dict(model.state_dict(), strict=False)
    added = tuple(f"{VARIANT_MODULES[v]}." for v in variants)
    if unexpected or any(not k.startswith(added) for k in missing):
        raise SystemExit(f"error: --add-variants {variants}: the weights do not fit (missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]})")
    return grown


def channels_last(model: StyleVAR) -> None:
    """The image encoders' and the tokenizer's convolutions in NHWC (faster on the CPU, the same result)."""
    for part in (model.style_encoder, model.content_encoder, model.tokenizer):
        part.to(memory_format=torch.channels_last)


def compiler_missing(device: torch.device) -> str | None:
    """Why torch.compile cannot build kernels for ``device`` here (None: it can)."""
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else "Triton is not installed"
    if device.type == "cpu":
        names = [n for n in (os.environ.get("CXX"), "g++", "c++", "clang++") if n]
        return None if any(shutil.which(n) for n in names) else "no C++ compiler found (g++, c++, clang++ or $CXX)"
    return f"no compiler for {device.type}"


def resolve_compile(args: argparse.Namespace, device: torch.device) -> tuple[bool, str]:
    """Whether the blocks are compiled, and a line saying why: ``--compile`` / ``--no-compile`` as given; by
    default from SFT_COMPILE_MIN_STEPS steps on where a compiler is found, not under ``--strategy fsdp``."""
    if args.compile is False:
        return False, "blocks eager (--no-compile)"
    missing = compiler_missing(device)
    if args.compile:
        if missing:
            raise SystemExit(f"error: --compile: {missing}")
        return True, "blocks compiled (--compile)"
    why = ("--strategy fsdp" if args.strategy == "fsdp" else missing if missing else
           f"a run of {args.max_steps} steps (< {SFT_COMPILE_MIN_STEPS})" if args.max_steps < SFT_COMPILE_MIN_STEPS
           else None)
    if why:
        return False, f"blocks eager by default: {why} (--compile to compile them)"
    return True, "blocks compiled by default (torch.compile; --no-compile for eager)"


def set_drop_path_rate(model: StyleVAR, rate: float) -> None:
    """The model's stochastic-depth rate (its config, recorded in RUN/final, and each block's share)."""
    model.cfg = dataclasses.replace(model.cfg, drop_path_rate=rate)
    for block, p in zip(model.blocks, model.cfg.drop_path_rates):
        block.drop_path = p


def prepare_model(model: StyleVAR, args: argparse.Namespace, env: DistEnv) -> None:
    """The model in train mode on the device: NHWC convs on the CPU (not FSDP), blocks compiled per ``args.compile``."""
    model.activation_checkpointing = args.activation_checkpointing
    model.to(env.device).train()
    if env.device.type == "cpu" and args.strategy != "fsdp":
        channels_last(model)
    if args.compile:
        compile_blocks(model)
