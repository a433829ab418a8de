"""Flicker of stylized video: clips with known motion made from the bundled photographs, stylized by the demo
model with each temporal mode of `StylePipeline.stylize_video` (`stylevar.pipelines.coherence`).

    python -m benchmarks.flicker [--frames 24] [--seeds 0-7] [--ablation] [--out benchmarks/results/flicker.json]
                                 [--markdown benchmarks/results/flicker.md] [--png docs/video_frames.png]

Clips (12 fps, written as H.264 mp4 through `stylevar.processing.video.VideoWriter`, then read back): three pans (a
window moving over a photograph by a whole number of pixels per frame), a zoom (the window shrinking about
the photograph's centre) and a cut (a pan over one photograph, then a pan over another). Per clip and mode:

- flicker: mean |out_t - warp(out_{t-1})| over the pixels whose source lies inside the previous frame, warp
  being the clip's known motion (a whole-pixel shift for the pans; bilinear for the zoom), in 8-bit levels,
  averaged over the frame pairs (the cut's pair left out); the same figure for the decoded content frames
  (compression and, for the zoom, resampling: what a perfectly coherent result would still show);
- edge correlation of each result with its content frame (`stylevar.metrics.structure.edge_correlation`) and
  the distance of its mean colour to the style's (`training.parts.demo_export.mean_colour_distance`), frame means;
- seconds per frame of the whole call (decode, stylize, encode), the modes taking turns clip by clip.

Rows: the four temporal modes; ``--ablation`` adds the coherent sampler's parts one by one (`stylevar.pipelines.coherence`).
Colour distance varies much from seed to seed (one coarse token sets a clip's palette): use several seeds.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from stylevar.utils.helptext import HelpFormatter
from stylevar.processing.video import TEMPORAL_MODES


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.flicker", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--frames", type=int, default=24, help="frames per clip")
    p.add_argument("--seeds", default="0-7", help="comma-separated, or FIRST-LAST")
    p.add_argument("--styles", default="style_brush,style_waves", help="bundled example styles, comma-separated")
    p.add_argument("--modes", default=",".join(TEMPORAL_MODES), help="temporal modes, comma-separated")
    p.add_argument("--ablation", action="store_true", help="add the coherent sampler's parts one by one")
    p.add_argument("--clips", default=None, help="comma-separated clip names (default: all)")
    p.add_argument("--threads", type=int, default=1, help="torch's CPU threads")
    p.add_argument("--out", type=Path, default=None, help="also write the table here (JSON)")
    p.add_argument("--markdown", type=Path, default=None, help="also write the table here (markdown)")
    p.add_argument("--png", type=Path, default=None, help="write a figure of frames of each mode here")
    args = p.parse_args(argv)
    from benchmarks.measures.flicker import execute  # torch: once the options are parsed

    return execute(args, argv)


if __name__ == "__main__":
    raise SystemExit(main())
