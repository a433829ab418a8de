"""GRPO rewards: R = -lambda * dist(generated, target), one value per rollout (higher is better).

``dreamsim``, ``lpips``, ``clip`` and ``ssim`` go through ``MetricSuite``; ``l1`` is the mean pixel distance;
``--reward-style-weight`` w adds w * colour_swd(generated, style). No torch at import (:data:`REWARDS` for --help).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

REWARDS = ("dreamsim", "lpips", "clip", "ssim", "l1")
_SUITE_METRIC = {"dreamsim": "dreamsim", "lpips": "lpips", "clip": "clip", "ssim": "ssim"}


@dataclass(frozen=True)
class RewardConfig:
    name: str = "dreamsim"
    scale: float = 5.0  # lambda
    image_size: int = 256  # metric resolution (all but l1)
    lpips_net: str = "vgg"
    batch_size: int = 32  # images per metric forward
    style_weight: float = 0.0  # w: + w * colour_swd(generated, style)

    def __post_init__(self):
        if self.name not in REWARDS:
            raise ValueError(f"unknown reward {self.name!r}; choose from {', '.join(REWARDS)}")
        if not self.scale > 0:
            raise ValueError(f"reward scale (lambda) must be > 0, got {self.scale}")
        if self.image_size < 16:
            raise ValueError(f"reward image size must be >= 16, got {self.image_size}")
        if not (self.style_weight >= 0 and math.isfinite(self.style_weight)):
            raise ValueError(f"reward style weight must be a finite number >= 0, got {self.style_weight}")


class Reward:
    """``reward(generated, content, style, target) -> (N,)`` float32 on the CPU."""

    def __init__(self, cfg: RewardConfig, device: str | torch.device | None = None):
        import torch
        self.cfg = cfg
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.suite = None
        if cfg.name in _SUITE_METRIC:
            from stylevar.metrics import MetricSuite

            self.suite = MetricSuite((_SUITE_METRIC[cfg.name],), device=self.device, lpips_net=cfg.lpips_net,
                                     batch_size=cfg.batch_size, image_size=cfg.image_size)
            self.suite.load()

    def distance(self, generated: torch.Tensor, content: torch.Tensor, style: torch.Tensor,
                 target: torch.Tensor) -> torch.Tensor:
        """The distance to the target (plus the weighted style term), (N,): 0 for a perfect match."""
        dist = self.target_distance(generated, content, style, target)
        if self.cfg.style_weight > 0:
            from stylevar.metrics.style_fidelity import colour_swd

            dist = dist + self.cfg.style_weight * colour_swd(generated.float(), style.float()).cpu()
        return dist

    def target_distance(self, generated: torch.Tensor, content: torch.Tensor, style: torch.Tensor,
                        target: torch.Tensor) -> torch.Tensor:
        """The named reward's distance to the target, (N,)."""
        if generated.shape != target.shape:
            raise ValueError(f"generated {tuple(generated.shape)} and target {tuple(target.shape)} differ in shape")
        name = self.cfg.name
        if name == "l1":
            return (generated.float() - target.float()).abs().mean((1, 2, 3)).cpu()
        assert self.suite is not None
        value = self.suite(generated, content, style, target)[_SUITE_METRIC[name]]
        if name in ("ssim", "clip"):  # similarities: 1 is a perfect match
            return 1.0 - value
        return value

    def __call__(self, generated: torch.Tensor, content: torch.Tensor, style: torch.Tensor,
                 target: torch.Tensor) -> torch.Tensor:
        return -self.cfg.scale * self.distance(generated, content, style, target)
