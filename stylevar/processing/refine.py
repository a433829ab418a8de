"""Content-guided refinement at the model's resolution: the output's edges put where the content's are, its colours
kept (the guided filter of He, Sun and Tang). Off unless the model directory's config.json asks (``"refine"``).
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
    """The guided filter of `output` with `content` as the guide (both in [0, 1]); unchanged when `cfg` is off."""
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
