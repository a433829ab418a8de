"""The `stylevar` command. Each sub-command lives with the code it runs and registers itself here."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _add_convert(sub) -> None:
    p = sub.add_parser("convert", help="convert published .pth checkpoints into a model directory")
    p.add_argument("--vae", required=True, help="VQ-VAE checkpoint (vae_ch160v4096z32.pth layout)")
    p.add_argument("--model", required=True, help="StyleVAR checkpoint (any published layout)")
    p.add_argument("--preset", default="d20", help="tiny|d16|d20|d24|d30 (ignored with --config)")
    p.add_argument("--config", help="reference config.json (patch_nums, V, Cvae, ch, depth, ...) instead of a preset")
    p.add_argument("--lora-scaling", type=float, help="alpha/rank for LoRA-wrapped files without args")
    p.add_argument("--name", default=None, help="model name recorded in config.json")
    p.add_argument("--fp16", action="store_true", help="store weights in float16")
    p.add_argument("--out", required=True, help="output model directory")
    p.set_defaults(func=_convert)


def _convert(args) -> int:
    import torch

    from stylevar.checkpoints import load_stylevar, load_vqvae
    from stylevar.config import StyleVARConfig, VQVAEConfig, presets
    from stylevar.pipeline import StylePipeline

    if args.config:
        ref = json.loads(Path(args.config).read_text())
        vq_cfg, tr_cfg = VQVAEConfig.from_reference(ref), StyleVARConfig.from_reference(ref)
    else:
        vq_cfg, tr_cfg = presets(args.preset)
    vq = load_vqvae(args.vae, vq_cfg)
    model = load_stylevar(args.model, tr_cfg, vq, lora_scaling=args.lora_scaling)
    pipe = StylePipeline.from_models(model, name=args.name or Path(args.model).stem)
    out = pipe.save_pretrained(args.out, dtype=torch.float16 if args.fp16 else None)
    print(f"wrote {out}")
    return 0


def _add_stylize(sub) -> None:
    from stylevar.images import RESIZE_MODES

    p = sub.add_parser("stylize", help="re-draw a content image in the style of another")
    p.add_argument("content")
    p.add_argument("style")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--model", default=None, help="model directory (default: the embedded demo model)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--style-strength", type=float, default=0.0, help="-1 (content) .. 1 (style)")
    p.add_argument("--top-k", type=int, default=None, help="default: the model's recommended value, else 900")
    p.add_argument("--top-p", type=float, default=None, help="default: the model's recommended value, else 0.96")
    p.add_argument("--resize", choices=RESIZE_MODES, default="stretch")
    p.add_argument("--device", default=None)
    p.set_defaults(func=_stylize)


def _stylize(args) -> int:
    from stylevar.images import load_image
    from stylevar.pipeline import StylePipeline

    pipe = StylePipeline.from_pretrained(args.model, device=args.device)
    if pipe.config.demo:
        print(f"using the {pipe.config.label}", file=sys.stderr)
    out = pipe(load_image(args.content), load_image(args.style), seed=args.seed, resize=args.resize,
               style_strength=args.style_strength, top_k=args.top_k, top_p=args.top_p)
    out.save(args.output)
    print(f"wrote {args.output} ({out.size[0]}x{out.size[1]})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from stylevar import __version__, bench

    parser = argparse.ArgumentParser(prog="stylevar", description=__doc__)
    parser.add_argument("--version", action="version", version=f"stylevar {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_convert(sub)
    _add_stylize(sub)
    bench.add_subparser(sub)
    # sub-commands registered by other modules
    from stylevar import lora; lora.add_subparser(sub)  # merge-lora
    from stylevar import weights; weights.add_subparser(sub)  # weights status|fetch
    from stylevar import evaluate; evaluate.add_subparser(sub)  # evaluate
    return parser


def main(argv: list[str] | None = None) -> int:
    from stylevar.checkpoints import CheckpointError
    from stylevar.images import ImageError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, CheckpointError, ImageError, ValueError) as e:
        print(f"stylevar {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
