"""Content-guided refinement: the model's output filtered with the content image as the guide.

A small tokenizer blurs edges: its reconstruction is the ceiling of what any transformer over its tokens
can draw (benchmarks/fidelity.md measures it). This step gives the content's edges back to the output
without touching its colours: the guided filter of He, Sun and Tang (ECCV 2010), with the content
image as the guide I and the model's output p as the input. In every (2r+1) x (2r+1) window the output
is fitted as a linear function of the content, q = a * I + b (least squares, a ridge of ``eps`` on a);
the windowed means of a and b are applied per pixel. Where the output varies with the content, its
edges are put where the content's are and sharpened; where it does not (a flat region of the content),
the output is smoothed. Window means are kept, so the output's colours (its style) are unchanged.
This is the fast form of the smoothing step that photorealistic stylization uses (Li et al., ECCV
2018, "A closed-form solution to photorealistic image stylization").

A model directory's ``config.json`` may carry ``"refine": {"radius": R, "eps": E}`` (radius in pixels
at the model's resolution); without it, or with radius 0, the pipeline returns the transformer's output
as it is, so published checkpoints compute exactly what the reference computes. The demo recipe
chooses R and E on its training split (`training.demo.export.choose_refinement`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Refinement:
    radius: int = 0  # window radius in pixels at the model's resolution; 0 = off
    eps: float = 1e-2  # ridge on the local slope, in squared [0, 1] intensity units: larger = smoother

    def __post_init__(self) -> None:
        if self.radius < 0:
            raise ValueError(f"refine radius must be >= 0, got {self.radius}")
        if not self.eps > 0:
            raise ValueError(f"refine eps must be > 0, got {self.eps}")

    @property
    def enabled(self) -> bool:
        return self.radius > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Refinement:
        d = d or {}
        unknown = set(d) - {"radius", "eps"}
        if unknown:
            raise ValueError(f"refine: unknown fields {sorted(unknown)} (known: radius, eps)")
        return cls(radius=int(d.get("radius", 0)), eps=float(d.get("eps", cls.eps)))


def refine(output_B3HW: torch.Tensor, content_B3HW: torch.Tensor, cfg: Refinement) -> torch.Tensor:
    """The guided filter of `output` (in [0, 1]) with `content` (in [0, 1], same size) as the guide,
    computed in float32 and clamped to [0, 1]; `output` unchanged when `cfg` is off."""
    if not cfg.enabled:
        return output_B3HW
    if output_B3HW.shape != content_B3HW.shape:
        raise ValueError(f"output {tuple(output_B3HW.shape)} and content {tuple(content_B3HW.shape)} differ")
    from kornia.filters import guided_blur

    side = min(output_B3HW.shape[-2:])
    radius = min(cfg.radius, (side - 1) // 2)  # reflect padding needs the window inside the image
    if radius < 1:
        return output_B3HW
    refined = guided_blur(content_B3HW.float(), output_B3HW.float(), 2 * radius + 1, cfg.eps)
    return refined.clamp_(0, 1).to(output_B3HW.dtype)
