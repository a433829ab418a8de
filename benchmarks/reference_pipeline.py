"""CPU inference time of the public reference StyleVAR, measured, on the reference-shaped configuration.

What it measures: the reference implementation's own end-to-end inference call,
`StyleVAR.autoregressive_infer(B, style_img, content_img, top_k=900, top_p=0.96, g_seed=seed)` under
`torch.inference_mode`, called as its eval/infer_grpo.py calls it. That one call does everything: the two
ResNet-18 encoders, the two VQ-VAE encodes to multi-scale tokens, the coarse-to-fine loop and the final
decode. Models are built with the reference's `models.build_vae_stylevar` at `benchmarks.cpu_pipeline`'s
`REFERENCE_CONFIG` (patch_nums 1..10 over 8 scales, V 4096, Cvae 32, ch 32, share_quant_resi 4, depth 8,
attn_l2_norm) with alpha_nums `StyleVARConfig.from_reference(REFERENCE_CONFIG).alpha_nums`, random weights
(seed 0), eval mode, fp32, CPU; inputs are `benchmarks.cpu_pipeline.images` (the same as that benchmark's).

    PYTHONPATH=/path/to/StyleVAR python -m benchmarks.reference_pipeline \
        [--batch-sizes 1,4] [--repeats 5] [--warmup 1] [--threads 2] [--stages] [--json]

It prints the median ms per image of the whole call per batch size (JSON: the same plus os.getloadavg()
before and after). `--stages` adds the reference's own stage functions timed alone: `vae.img_to_idxBl` on
content and style (encode), its two ResNet-18 encoders with `feat_emb` (encoders) and `vae.fhat_to_img`
(decode); the loop's share is the total less those.

The reference is not vendored: nothing of it is in this repository. Get it with
`git clone https://github.com/Senfier-LiqiJing/StyleVAR` (measured at commit
61fc9f1476662d083f07dd2b80daeb9ef5e18b68) and put the checkout on PYTHONPATH; it needs torch, torchvision
and huggingface_hub (all in this project's environment), not flash-attn or xformers (absent, so it takes its
scaled_dot_product_attention path, as it would on any CPU). What this adapter supplies around it:
  - `dist`: the reference imports a top-level `dist` module (VAR's) that its repository does not contain;
    when none is importable, a two-function stand-in is registered in sys.modules (`get_device()` -> CPU,
    `initialized()` -> False, what VAR's dist answers in a single CPU process).
  - ResNet-18 weights: the reference asks torchvision for `ResNet18_Weights.IMAGENET1K_V1`. Nothing is
    downloaded: a random-weight resnet18 state dict (torchvision's own initialisation, seeded) is written
    under torchvision's file name in a temporary TORCH_HOME's hub/checkpoints/ for the build (the hash is
    only checked on download). The reference's `init_weights` then re-initialises those encoders anyway.
  - VQ-VAE weights: `build_vae_stylevar` disables `reset_parameters` of conv/linear/norm layers for speed
    (process-wide, expecting a checkpoint), which leaves the VQ-VAE's convolutions uninitialised memory;
    they get PyTorch's default initialisation (seeded), so that no NaN or denormal garbage skews the times,
    and the initialisers are put back after the build for whatever the process builds next.
  - The reference's construction messages go to stderr, keeping stdout for the table or the JSON.
"""
from __future__ import annotations

import argparse

from benchmarks.side_by_side import timing_arguments
from stylevar.utils.helptext import HelpFormatter


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.reference_pipeline", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    timing_arguments(p, repeats=5, warmup=1)
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs")
    p.add_argument("--stages", action="store_true", help="also time encode, encoders and decode alone")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    a = p.parse_args(argv)
    from benchmarks.measures.reference_pipeline import execute  # torch: once the options are parsed

    return execute(a)


if __name__ == "__main__":
    raise SystemExit(main())
