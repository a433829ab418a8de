"""`stylevar pull`: a published model from the Hugging Face Hub -> a model directory (stylevar.loaders.hub)."""
from __future__ import annotations

import argparse
import json

from stylevar.cli.command import Command


def add_arguments(p: argparse.ArgumentParser) -> None:
    from stylevar.loaders.hub import DEFAULT_PRESET, DEFAULT_REPO, DEFAULT_REVISION, SHAPE_FILE, VARIANTS  # no torch
    p.description = ("Download a published StyleVAR model from the Hugging Face Hub (through huggingface_hub: its "
                     "cache, HF_TOKEN, HF_HUB_OFFLINE, HF_ENDPOINT) and convert it into a model directory. "
                     "Re-running is a no-op once the folder is complete.")
    p.add_argument("repo_id", nargs="?", default=DEFAULT_REPO, metavar="REPO_ID",
                   help=f"Hub repository OWNER/NAME (default {DEFAULT_REPO})")
    p.add_argument("--variant", choices=tuple(VARIANTS), default=None,
                   help=f"which checkpoint: grpo ({VARIANTS['grpo']}, LoRA merged; the default) or sft ({VARIANTS['sft']})")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--preset", default=None, help=f"model shape (default: the repository's {SHAPE_FILE} "
                                                      f"if it has one, else {DEFAULT_PRESET})")
    shape.add_argument("--config", metavar="CONFIG.json",
                       help="reference config fields (patch_nums, V, Cvae, ch, depth, ...) for non-standard sizes")
    p.add_argument("--revision", default=DEFAULT_REVISION, help="branch, tag or commit (default main)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="model directory to write (default STYLEVAR_HOME/models/OWNER--NAME/VARIANT...)")
    p.add_argument("--force", action="store_true", help="convert again even if the folder is complete")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stylevar.loaders import preflight
    from stylevar.config import PRESETS
    from stylevar.loaders.hub import DEFAULT_REVISION, PREFIX, HubModel, Shape
    from stylevar.loaders.pull import pull
    model = HubModel.parse(args.repo_id.removeprefix(PREFIX), prefix=False)  # a hub id is taken too
    model = HubModel(model.repo_id, args.variant or model.variant,
                     args.revision if args.revision != DEFAULT_REVISION else model.revision)
    if args.preset is not None and args.preset not in PRESETS:
        raise preflight.InputError(f"--preset {args.preset!r}: choose from {', '.join(PRESETS)}")
    shape = Shape(preset=args.preset)
    if args.config:
        try:
            shape = Shape(reference=json.loads(preflight.input_file(args.config, "--config").read_text()))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise preflight.InputError(f"--config {args.config} is not a JSON file ({e})") from None
    if args.out is not None:
        preflight.output_folder(args.out, "--out folder")
    result = pull(model, shape=shape, out=args.out, force=args.force, progress=not args.quiet)
    if result.skipped:
        print(f"{model.id} is already at {result.path}: nothing to do (--force converts again)")
    else:
        print(f"wrote {result.path}")
    print(f"use it with: stylevar stylize CONTENT STYLE -o OUT.png --model {result.path}\n"
          f"         or: python -m serve --model {result.path}")
    return 0


COMMAND = Command("pull", "download a published model from the Hugging Face Hub into a model directory", add_arguments)
