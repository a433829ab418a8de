"""What running the tokenizer's convolutions in bf16 changes: tokens per scale and decoded pixels against fp32.

On the example images it reports, per scale, the fraction of tokens equal to fp32's with the encoder in bf16
(with and without quant_conv), and the largest pixel difference of decoding in bf16. `--model demo` is the
trained demo model; a preset name builds random weights of that shape.
"""
from __future__ import annotations

import copy
from pathlib import Path

from benchmarks.harness import command_parser, emit, serving_process

EXAMPLES = Path(__file__).resolve().parent.parent / "stylevar" / "assets" / "examples"


def example_images(size: int):
    """The example photos and paintings, centre-cropped to ``size`` px, (N, 3, size, size) in [-1, 1]."""
    import numpy as np
    import torch
    from PIL import Image, ImageOps
    paths = sorted(p for p in EXAMPLES.iterdir() if p.name.startswith(("photo_", "painting_")))
    arrays = [np.asarray(ImageOps.fit(Image.open(p).convert("RGB"), (size, size))) for p in paths]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float().div(127.5).sub(1)


def variants(model):
    """Prepared bf16 copies of ``model``, each with one tokenizer setting, by name."""
    from stylevar.runtime.inference import InferenceConfig, prepare
    # the last: the encoder in bf16 with quant_conv left in fp32 (the latent straight into the quantizer)
    settings = {"encoder": "tokenizer_encoder", "decoder": "tokenizer_decoder",
                "encoder, quant_conv fp32": "tokenizer_encoder"}
    out = {name: prepare(copy.deepcopy(model), InferenceConfig(precision="bf16"), parts=frozenset({part}))
           for name, part in settings.items()}
    tok = out["encoder, quant_conv fp32"].tokenizer
    tok.quant_conv = tok.quant_conv.module.float()
    return out


def measure(model, images) -> dict:
    """Token agreement per scale of each encoder setting, and the bf16 decoder's largest and mean pixel difference."""
    import torch

    def tokens(tok):
        return [torch.cat(t) for t in zip(*(tok.encode_indices(x[None]) for x in images))]

    with torch.inference_mode():
        copies, ref_idx = variants(model), tokens(model.tokenizer)
        dec = copies.pop("decoder").tokenizer
        out = {"images": len(images), "agreement_per_scale": {
            name: [float((a == b).float().mean()) for a, b in zip(ref_idx, tokens(m.tokenizer))]
            for name, m in copies.items()}}
        diffs = [(model.tokenizer.decode_indices(one) - dec.decode_indices(one)).abs() / 2
                 for one in ([t[i:i + 1] for t in ref_idx] for i in range(len(images)))]
        out["decoder_max_pixel_difference"] = max(float(d.max()) for d in diffs)
        out["decoder_mean_pixel_difference"] = sum(float(d.mean()) for d in diffs) / len(diffs)
    return out


def main(argv=None) -> int:
    p = command_parser("benchmarks.bf16_tokenizer", __doc__.splitlines()[0])
    p.add_argument("--model", default="demo", help="'demo' (the trained demo model) or a preset (random weights)")
    p.add_argument("--images", type=int, help="how many of the example images (default: all)")
    p.add_argument("--threads", type=int, default=2, help="torch's CPU threads")
    p.add_argument("--json", type=Path, help="also write every figure here")
    args = p.parse_args(argv)
    from stylevar.pipelines.pipeline import StylePipeline
    serving_process(args.threads)
    demo = args.model == "demo"
    pipe = StylePipeline.from_pretrained(threads="torch") if demo else StylePipeline.random(args.model, seed=0)
    model = pipe.model.eval()
    out = {"model": args.model, **measure(model, example_images(model.tokenizer.cfg.image_size)[:args.images])}
    largest, mean = out["decoder_max_pixel_difference"], out["decoder_mean_pixel_difference"]
    lines = [(f"{args.model}: {out['images']} images; bf16 decoder: pixel difference to fp32 at most "
              f"{255 * largest:.2f}/255, on average {255 * mean:.2f}/255")]
    lines += [(f"  {name}: tokens equal to fp32's per scale " + " ".join(f"{100 * a:.1f}%" for a in agreement))
              for name, agreement in out["agreement_per_scale"].items()]
    return emit(out, args.json, "\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
