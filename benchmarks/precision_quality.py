"""What the inference precisions do to the demo model's pictures: fp32 against bf16.

    python -m benchmarks.precision_quality [--n 32] [--seed 0] [--threads 2] [--json]

The demo model (stylevar/assets/demo) is prepared once per precision (`stylevar.runtime.inference.prepare`) and
run on the same held-out synthetic pairs (`training.parts.demo_export.heldout_triplets`, a synthesis seed no training
data uses) and the bundled photographs, with the model's recommended sampling settings and the same seeds.
Per precision it prints the demo's evaluation metrics (`training.parts.demo_export.evaluate_model` with the demo's
metric suite: edge correlation with the content, SSIM and L1 to the target where there is one, colour
distance to the style, seed spread, seconds per image; LPIPS, DreamSim, CLIP only where cached),
the share of sampled tokens equal to the plain fp32 model's, and the mean absolute pixel difference from
the plain fp32 model's pictures; copy-content and Reinhard are the baselines.
"""
from __future__ import annotations

import argparse
import json

from stylevar.utils.helptext import HelpFormatter


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.precision_quality", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--n", type=int, default=32, help="held-out synthetic pairs")
    p.add_argument("--seed", type=int, default=0, help="pair i uses seed + i")
    p.add_argument("--threads", type=int, default=2, help="torch's CPU threads")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    a = p.parse_args(argv)
    from benchmarks.measures.precision_quality import measure  # torch: once the options are parsed

    out = measure(a)
    if a.json:
        print(json.dumps(out))
        return 0
    for name, rows in out["rows"].items():
        keys = [k for k in rows["fp32"] if k not in ("token_agreement", "pixel_diff")]
        print(f"\n{name} ({out['n'][name]} pairs)")
        print("| method | " + " | ".join(keys) + " | tokens = fp32 | pixel diff |")
        print("| --- " * (len(keys) + 3) + "|")
        for method, row in rows.items():
            cells = [f"{row[k]:.4f}" if k in row else "-" for k in keys]
            extra = [f"{100 * row['token_agreement']:.1f}%", f"{row['pixel_diff']:.4f}"] if "token_agreement" in row \
                else ["-", "-"]
            print(f"| {method} | " + " | ".join(cells + extra) + " |")
    return 0



if __name__ == "__main__":
    raise SystemExit(main())
