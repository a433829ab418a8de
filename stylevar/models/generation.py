"""The settings of one generation, with their defaults defined once (`DEFAULT_GENERATION`): sampling (top-k,
top-p, seed), the blend (style strength, per-scale alphas, guidance) and fast sampling. `GenerationConfig.resolve`
puts a caller's values over a model's recommended ones (config.json) over the defaults. No torch.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GenerationConfig:
    top_k: int = 900  # 0 switches top-k off
    top_p: float = 0.96  # 0 or 1 switches nucleus sampling off
    seed: int | Sequence[int] | None = None  # one for the batch, or one per row; None: a random one
    style_strength: float = 0.0  # -1 keeps more of the content .. 1 takes more of the style
    alphas: Sequence[float] | None = None  # the blend weight of each scale (a tensor too); None: the model's
    guidance: float = 0.0  # >= 0: push away from the prediction without the style; 0: the plain model
    # prune the finest scales' computation (stylevar.models.transformer.pruning; the model's `fast_sampling` plan);
    # False: the full sampler
    fast: bool = False

    @classmethod
    def from_kwargs(cls, settings: Mapping[str, Any]) -> GenerationConfig:
        """From keyword settings, None meaning unset (the default). An unknown name is a TypeError."""
        return cls(**{k: v for k, v in settings.items() if v is not None})

    @classmethod
    def resolve(cls, recommended: Mapping[str, Any], **settings: Any) -> GenerationConfig:
        """The caller's ``settings`` (None = unset) over a model's ``recommended`` ones over the defaults."""
        return cls.from_kwargs({**recommended, **{k: v for k, v in settings.items() if v is not None}})

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `StyleVAR.generate`."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


DEFAULT_GENERATION = GenerationConfig()
