"""Model directories: what one holds, its config.json (`PipelineConfig`), the check that one is whole, and
writing one.

A model directory holds `config.json`, `tokenizer.safetensors`, `transformer.safetensors` and a
`README.md` model card. Each model reads and writes its own weights file and config.json section
(`MultiScaleVQVAE` / `StyleVAR`.save_pretrained, from_pretrained, `stylevar.models.pretrained`); the rest of
config.json is `PipelineConfig`'s. The embedded demo model lives in `stylevar/assets/demo/`. Loading one
as a pipeline is `stylevar.pipelines.pipeline`'s; making one from a published model `stylevar.loaders.pull`'s.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# the folder's check, torch-free, is model_folder's; its names stay importable from here
from stylevar.loaders.model_folder import (DEMO_MODEL_DIR, MODEL_FILES, ModelDirError,  # noqa: F401
                                           check_model_files, missing_model_files)
from stylevar.utils.atomic import atomic_write_text
from stylevar.config import StyleVARConfig, VQVAEConfig
from stylevar.processing.palette import Palette
from stylevar.models.pretrained import read_config, write_config
from stylevar.processing.refine import Refinement
from stylevar.models.transformer import StyleVAR
from stylevar.processing.upsample import Upsampling

DEMO_LABEL = "demo model (small, trained on generated data)"
FORMAT_VERSION = 1


@dataclass
class PipelineConfig:
    tokenizer: VQVAEConfig
    transformer: StyleVARConfig
    name: str = "stylevar"
    demo: bool = False
    # the model's recommended generation settings (e.g. {"top_k": 64, "top_p": 0.9}); a caller's explicit
    # value wins, and without either the defaults of `stylevar.models.generation.GenerationConfig` apply
    generation: dict[str, Any] = field(default_factory=dict)
    # content-guided refinement of the output (stylevar.processing.refine); off unless the model directory asks for it
    refine: Refinement = field(default_factory=Refinement)
    # the style's palette given to the output (stylevar.processing.palette); off unless the model directory asks for it
    palette: Palette = field(default_factory=Palette)
    # how drawings reach the result's size (stylevar.processing.upsample); written to config.json only when not the default
    upsample: Upsampling = field(default_factory=Upsampling)
    extra: dict[str, Any] = field(default_factory=dict)  # provenance: training settings, dates, metrics

    @property
    def label(self) -> str:
        return DEMO_LABEL if self.demo else self.name

    def to_dict(self) -> dict[str, Any]:
        return {"format": "stylevar", "format_version": FORMAT_VERSION, "name": self.name, "demo": self.demo,
                "tokenizer": self.tokenizer.to_dict(), "transformer": self.transformer.to_dict(),
                "generation": self.generation, **({"refine": self.refine.to_dict()} if self.refine.enabled else {}),
                **({"palette": self.palette.to_dict()} if self.palette.enabled else {}),
                **({"upsample": self.upsample.to_dict()} if self.upsample != Upsampling() else {}),
                "extra": self.extra}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PipelineConfig":
        if d.get("format") != "stylevar":
            raise ValueError("config.json is not a StyleVAR model config (missing \"format\": \"stylevar\")")
        return cls(VQVAEConfig.from_dict(d["tokenizer"]), StyleVARConfig.from_dict(d["transformer"]),
                   name=d.get("name", "stylevar"), demo=bool(d.get("demo", False)),
                   generation=dict(d.get("generation", {})), refine=Refinement.from_dict(d.get("refine")),
                   palette=Palette.from_dict(d.get("palette")), upsample=Upsampling.from_dict(d.get("upsample")),
                   extra=d.get("extra", {}))

    @classmethod
    def from_dir(cls, model_dir: str | os.PathLike) -> "PipelineConfig":
        """The config.json of a model directory."""
        return cls.from_dict(read_config(model_dir))


def check_model_dir(path: str | os.PathLike) -> PipelineConfig:
    """The config of the whole model directory at ``path``. A missing folder or file is a ModelDirError naming
    it, with the likely fix (`stylevar.loaders.model_folder`); a config.json that is not a StyleVAR one a
    ValueError."""
    return PipelineConfig.from_dir(check_model_files(path))


def write_model_dir(model: StyleVAR, config: PipelineConfig, folder: str | os.PathLike,
                    dtype: torch.dtype | None = None, model_card: str | None = None) -> Path:
    """Write the transformer's and the tokenizer's files (floats cast to `dtype` when given), then all of
    config.json from `config` and the model card when given. A model prepared for inference is refused
    before anything is written. Returns the folder."""
    d = model.save_pretrained(folder, dtype)
    model.tokenizer.save_pretrained(d, dtype)
    write_config(d, config.to_dict())
    if model_card is not None:
        atomic_write_text(d / "README.md", model_card)
    return d
