"""Model configurations for the training recipes: ``--preset`` is a preset name (tiny, d16, d20, d24, d30) or a
JSON file ``{"tokenizer": {VQVAEConfig fields}, "transformer": {StyleVARConfig fields}}`` (either part optional);
``--image-size S`` drops the tokenizer's finest scales so that ``patch_nums[-1] * downsample == S``.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from stylevar.config import PRESETS, StyleVARConfig, VQVAEConfig, presets


def load_preset(name_or_path: str) -> tuple[VQVAEConfig, StyleVARConfig]:
    """(tokenizer config, transformer config) of a preset name or a JSON file."""
    if name_or_path in PRESETS:
        return presets(name_or_path)
    path = Path(name_or_path)
    if path.suffix != ".json" or not path.is_file():
        raise ValueError(f"--preset must be one of {PRESETS} or an existing .json file, not {name_or_path!r}")
    try:
        d = json.loads(path.read_text())
        unknown = set(d) - {"tokenizer", "transformer"}
        if unknown:
            raise ValueError(f"unknown sections {sorted(unknown)} (expected 'tokenizer', 'transformer')")
        vq = VQVAEConfig.from_dict(d.get("tokenizer", {}))
        tr = StyleVARConfig.from_dict(d.get("transformer", {}))
    except (ValueError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a valid preset file: {e}") from e
    return vq, tr


def resize_tokenizer(cfg: VQVAEConfig, image_size: int | None) -> VQVAEConfig:
    """``cfg`` with the scales above ``image_size / downsample`` dropped (None: unchanged)."""
    if image_size is None or image_size == cfg.image_size:
        return cfg
    side, rem = divmod(image_size, cfg.downsample)
    if rem or side not in cfg.patch_nums:
        ok = [p * cfg.downsample for p in cfg.patch_nums]
        raise ValueError(f"--image-size {image_size} is not available for this tokenizer; choose one of {ok}")
    return dataclasses.replace(cfg, patch_nums=tuple(p for p in cfg.patch_nums if p <= side))


def match_transformer(tr: StyleVARConfig, vq: VQVAEConfig) -> StyleVARConfig:
    """The transformer config fitted to a tokenizer's scales, codebook and code width (alphas re-spread linearly)."""
    k = len(vq.patch_nums)
    alphas = tr.alpha_nums
    if len(alphas) != k:
        lo, hi = alphas[0], alphas[-1]
        alphas = tuple(round(lo + (hi - lo) * i / (k - 1), 6) for i in range(k)) if k > 1 else (lo,)
    return dataclasses.replace(
        tr, patch_nums=tuple(vq.patch_nums), vocab_size=vq.vocab_size, z_channels=vq.z_channels, alpha_nums=alphas
    )
