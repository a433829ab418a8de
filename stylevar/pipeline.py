"""StylePipeline: a model directory in, PIL images in and out.

A model directory holds `config.json`, `tokenizer.safetensors`, `transformer.safetensors` and a
`README.md` model card. The embedded demo model lives in `stylevar/assets/demo/`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from PIL import Image

from stylevar.checkpoints import load_safetensors, load_stylevar, load_vqvae, save_safetensors
from stylevar.config import StyleVARConfig, VQVAEConfig, presets
from stylevar.images import Fit, ResizeMode, fit_square, pil_to_tensor, tensor_to_pil, to_rgb, unfit
from stylevar.tokenizer import MultiScaleVQVAE
from stylevar.transformer import StyleVAR

DEMO_MODEL_DIR = Path(__file__).resolve().parent / "assets" / "demo"
DEMO_LABEL = "demo model (trained on synthetic data)"
FORMAT_VERSION = 1


class ModelDirError(FileNotFoundError):
    """A model directory that is missing or incomplete."""


@dataclass
class PipelineConfig:
    tokenizer: VQVAEConfig
    transformer: StyleVARConfig
    name: str = "stylevar"
    demo: bool = False
    # the model's recommended sampling settings (e.g. {"top_k": 64, "top_p": 0.9}); a caller's explicit
    # value wins, and without either `generate`'s own defaults (top-k 900, top-p 0.96) apply
    generation: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # provenance: training settings, dates, metrics

    @property
    def label(self) -> str:
        return DEMO_LABEL if self.demo else self.name

    def to_dict(self) -> dict[str, Any]:
        return {"format": "stylevar", "format_version": FORMAT_VERSION, "name": self.name, "demo": self.demo,
                "tokenizer": self.tokenizer.to_dict(), "transformer": self.transformer.to_dict(),
                "generation": self.generation, "extra": self.extra}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PipelineConfig":
        if d.get("format") != "stylevar":
            raise ValueError("config.json is not a StyleVAR model config (missing \"format\": \"stylevar\")")
        return cls(VQVAEConfig.from_dict(d["tokenizer"]), StyleVARConfig.from_dict(d["transformer"]),
                   name=d.get("name", "stylevar"), demo=bool(d.get("demo", False)),
                   generation=dict(d.get("generation", {})), extra=d.get("extra", {}))


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class StylePipeline:
    def __init__(self, model: StyleVAR, config: PipelineConfig):
        self.model = model.eval()
        self.config = config

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def from_models(cls, model: StyleVAR, **config_kwargs) -> "StylePipeline":
        return cls(model, PipelineConfig(model.tokenizer.cfg, model.cfg, **config_kwargs))

    @classmethod
    def random(cls, preset: str | tuple[VQVAEConfig, StyleVARConfig] = "tiny", seed: int = 0,
               name: str = "random-init") -> "StylePipeline":
        """An untrained pipeline (for tests and benchmarks)."""
        vq_cfg, tr_cfg = presets(preset) if isinstance(preset, str) else preset
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = StyleVAR(tr_cfg, MultiScaleVQVAE(vq_cfg))
        return cls.from_models(model, name=name)

    @classmethod
    def from_pretrained(cls, model_dir: str | os.PathLike | None = None, device: str | torch.device | None = None,
                        autocast_dtype: torch.dtype | None = None) -> "StylePipeline":
        """Load a model directory (default: the embedded demo model). On CUDA, bf16 autocast by default."""
        d = Path(model_dir) if model_dir is not None else DEMO_MODEL_DIR
        files = [d / "config.json", d / "tokenizer.safetensors", d / "transformer.safetensors"]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            hint = (" The demo model is built by `scripts/train_demo_model.sh`." if d == DEMO_MODEL_DIR
                    else " A model directory is made by `stylevar convert` or a training run's RUN/final/.")
            raise ModelDirError(f"model directory {d} lacks {', '.join(missing)}.{hint}")
        config = PipelineConfig.from_dict(json.loads((d / "config.json").read_text()))
        tokenizer = load_vqvae(load_safetensors(d / "tokenizer.safetensors"), config.tokenizer)
        model = load_stylevar(load_safetensors(d / "transformer.safetensors"), config.transformer, tokenizer)
        device = torch.device(device) if device is not None else default_device()
        model.to(device)
        if device.type == "cuda":
            model.autocast_dtype = autocast_dtype or torch.bfloat16
        else:
            model.autocast_dtype = autocast_dtype
        return cls(model, config)

    def save_pretrained(self, model_dir: str | os.PathLike, dtype: torch.dtype | None = None,
                        model_card: str | None = None) -> Path:
        """Write config.json + tokenizer/transformer safetensors (floats cast to `dtype` when given)."""
        d = Path(model_dir)
        d.mkdir(parents=True, exist_ok=True)
        save_safetensors(self.model.tokenizer.state_dict(), d / "tokenizer.safetensors", dtype)
        save_safetensors(self.model.transformer_state_dict(), d / "transformer.safetensors", dtype)
        (d / "config.json").write_text(json.dumps(self.config.to_dict(), indent=1) + "\n")
        if model_card is not None:
            (d / "README.md").write_text(model_card)
        return d

    # ---- properties ---------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.model.pos_1LC.device

    @property
    def image_size(self) -> int:
        return self.config.tokenizer.image_size

    def to(self, device: str | torch.device) -> "StylePipeline":
        self.model.to(device)
        return self

    # ---- images -------------------------------------------------------------------------------
    def preprocess(self, images: Sequence[Image.Image], resize: ResizeMode = "stretch"
                   ) -> tuple[torch.Tensor, list[Fit]]:
        """PIL images -> (B, 3, S, S) in [-1, 1] on the model's device, and how each was fitted."""
        fitted = [fit_square(to_rgb(im), self.image_size, resize) for im in images]
        x = torch.stack([pil_to_tensor(sq) for sq, _ in fitted]).to(self.device)
        return x.mul(2).sub(1), [f for _, f in fitted]

    def stylize_batch(
        self,
        contents: Sequence[Image.Image],
        styles: Sequence[Image.Image],
        *,
        seeds: Sequence[int] | int | None = None,
        resize: ResizeMode = "stretch",
        on_scale: Callable[[int, torch.Tensor], None] | None = None,
        max_side: int | None = None,
        **gen_kwargs,
    ) -> list[Image.Image]:
        """One `generate` call for a batch; each result has its content's aspect ratio (see `unfit`)."""
        if len(contents) != len(styles):
            raise ValueError(f"{len(contents)} content images but {len(styles)} style images")
        content, fits = self.preprocess(contents, resize)
        style, _ = self.preprocess(styles, "crop")
        out = self.model.generate(content, style, seed=seeds, on_scale=on_scale, **self.generation_kwargs(**gen_kwargs))
        return [unfit(tensor_to_pil(img), fit, max_side) for img, fit in zip(out, fits)]

    def generation_kwargs(self, **gen_kwargs) -> dict[str, Any]:
        """`generate` keyword arguments: the caller's (None = unset) over the model's recommended ones."""
        return {**self.config.generation, **{k: v for k, v in gen_kwargs.items() if v is not None}}

    def __call__(self, content: Image.Image, style: Image.Image, *, seed: int | None = None,
                 resize: ResizeMode = "stretch", **gen_kwargs) -> Image.Image:
        return self.stylize_batch([content], [style], seeds=seed, resize=resize, **gen_kwargs)[0]
