"""`stylevar convert`: published .pth checkpoints -> a model directory."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from stylevar.cli.command import Command


def add_arguments(p: argparse.ArgumentParser) -> None:
    from stylevar.config import PRESETS
    p.add_argument("--vae", required=True, help="VQ-VAE checkpoint (vae_ch160v4096z32.pth layout)")
    p.add_argument("--model", required=True, help="StyleVAR checkpoint (any published layout)")
    p.add_argument("--preset", default="d20", choices=PRESETS, help="model shape (ignored with --config)")
    p.add_argument("--config", help="reference config.json (patch_nums, V, Cvae, ch, depth, ...) instead of a preset")
    p.add_argument("--lora-scaling", type=float, help="alpha/rank for LoRA-wrapped files without args")
    p.add_argument("--name", default=None, help="model name recorded in config.json")
    p.add_argument("--fp16", action="store_true", help="store weights in float16")
    p.add_argument("--out", required=True, help="output model directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stylevar.loaders import preflight
    preflight.input_file(args.vae, "--vae checkpoint")
    preflight.input_file(args.model, "--model checkpoint")
    ref = None
    if args.config:
        try:
            ref = json.loads(preflight.input_file(args.config, "--config").read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise preflight.InputError(f"--config {args.config} is not a JSON file ({e})") from None
    preflight.output_folder(args.out, "--out folder")

    import torch  # the checks are done: from here on the work
    from stylevar.loaders.convert import load_stylevar, load_vqvae
    from stylevar.config import StyleVARConfig, VQVAEConfig, presets
    from stylevar.pipelines.pipeline import StylePipeline
    if ref is not None:
        vq_cfg, tr_cfg = VQVAEConfig.from_reference(ref), StyleVARConfig.from_reference(ref)
    else:
        vq_cfg, tr_cfg = presets(args.preset)
    vq = load_vqvae(args.vae, vq_cfg)
    model = load_stylevar(args.model, tr_cfg, vq, lora_scaling=args.lora_scaling)
    pipe = StylePipeline.from_models(model, name=args.name or Path(args.model).stem)
    out = pipe.save_pretrained(args.out, dtype=torch.float16 if args.fp16 else None)
    print(f"wrote {out}")
    return 0


COMMAND = Command("convert", "convert published .pth checkpoints into a model directory", add_arguments)
