"""Bake the LoRA adapters of a GRPO checkpoint into a plain model directory: ``python -m training.merge_lora``.

A RUN directory means its newest ``checkpoints/step-*.pt``. A training.grpo checkpoint carries the model config
and the LoRA scaling; any other LoRA checkpoint takes ``--config MODEL_DIR`` and, without ``args``, ``--lora-scaling``.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Mapping, Sequence

from stylevar.cli.command import Command, Parser


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's arguments (also those of ``stylevar merge-lora``)."""
    p.add_argument("checkpoint", help="a GRPO checkpoint (RUN/checkpoints/step-*.pt) or a RUN directory (its newest one)")
    p.add_argument("--out", required=True, help="output model directory")
    p.add_argument("--config", metavar="MODEL_DIR",
                   help="model directory whose config.json (and tokenizer) to use when the checkpoint has none")
    p.add_argument("--lora-scaling", type=float,
                   help="alpha/rank when the checkpoint records neither its LoRA config nor lora_rank/lora_alpha args")
    p.add_argument("--name", default="stylevar-grpo", help="model name recorded in config.json")
    p.add_argument("--fp16", action="store_true", help="store weights in float16")
    p.set_defaults(func=merge_command)


COMMAND = Command("merge-lora", "bake the LoRA adapters of a GRPO checkpoint into a plain model directory",
                  add_arguments)  # `stylevar merge-lora`: the stylevar.commands entry point in pyproject.toml


def merge_command(args: argparse.Namespace) -> int:
    import torch  # here, not at the top: `stylevar --help` imports this module for COMMAND
    from stylevar.loaders.convert import load_stylevar, load_vqvae, read_state
    from stylevar.models.state_dict import CheckpointError
    from stylevar.models.lora import LoRAConfig
    from stylevar.loaders.model_dir import PipelineConfig, check_model_dir
    from stylevar.pipelines.pipeline import StylePipeline
    from stylevar.models.pretrained import load_safetensors
    from stylevar.models.state_dict import read_file
    from stylevar.models.tokenizer import MultiScaleVQVAE
    from training.parts.checkpoints import newest_checkpoint
    path = newest_checkpoint(args.checkpoint)
    state = read_file(path, what="checkpoint")
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{path} does not hold a checkpoint dict")
    extra = state.get("extra") if isinstance(state.get("extra"), Mapping) else {}
    cfg_dict = extra.get("pipeline_config")
    model_dir = Path(args.config) if args.config else None
    if cfg_dict is None:
        if model_dir is None:
            raise CheckpointError(f"{path} carries no model config; pass --config MODEL_DIR (the model it was trained from)")
        config = check_model_dir(model_dir)
    else:
        config = PipelineConfig.from_dict(cfg_dict)
    sd, _ = read_state(state)
    if not any(k.endswith(".lora_A") for k in sd):
        raise CheckpointError(f"{path} has no LoRA weights (*.lora_A); it is not a GRPO checkpoint")
    tok_sd = {k[len("tokenizer."):]: v for k, v in sd.items() if k.startswith("tokenizer.")}
    if not tok_sd:
        if model_dir is None:
            raise CheckpointError(f"{path} holds no tokenizer weights; pass --config MODEL_DIR to take them from there")
        tok_sd = load_safetensors(model_dir / MultiScaleVQVAE.weights_file)
    vqvae = load_vqvae(tok_sd, config.tokenizer)
    scaling = args.lora_scaling
    if scaling is None and isinstance(extra.get("lora"), Mapping):  # what training.grpo records
        lora = extra["lora"]
        scaling = LoRAConfig(rank=int(lora["rank"]), alpha=float(lora["alpha"])).scaling
    model = load_stylevar(state, config.transformer, vqvae, lora_scaling=scaling)
    extra_cfg = {**config.extra, "merged_from": str(path), "step": int(state.get("step", -1))}
    pipe = StylePipeline(model, dataclasses.replace(config, name=args.name, demo=False, extra=extra_cfg))
    out = pipe.save_pretrained(args.out, dtype=torch.float16 if args.fp16 else None)
    print(f"merged the LoRA adapters of {path} into {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = Parser(prog="python -m training.merge_lora", description=__doc__.split("\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return merge_command(args)
    except (FileNotFoundError, ValueError) as e:  # CheckpointError is a ValueError
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
