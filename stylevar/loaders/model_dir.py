"""Model directories: what one holds (`MODEL_FILES`), the check that a folder is one (saying what the user probably
meant when it is not), its config.json (`PipelineConfig`), and writing one. Each model reads and writes its own
weights file and config.json section. Importing this module does not import torch.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stylevar.config import CONFIG_FILE, TOKENIZER_FILE, TRANSFORMER_FILE, StyleVARConfig, VQVAEConfig
from stylevar.loaders.hub import PREFIX, looks_like_repo_id

if TYPE_CHECKING:
    import torch

    from stylevar.models.transformer import StyleVAR
    from stylevar.processing.palette import Palette
    from stylevar.processing.refine import Refinement
    from stylevar.processing.upsample import Upsampling

DEMO_MODEL_DIR = Path(__file__).resolve().parents[1] / "assets" / "demo"
DEMO_LABEL = "demo model (small, trained on generated data)"
MODEL_FILES = (CONFIG_FILE, TOKENIZER_FILE, TRANSFORMER_FILE)
LOCAL_MODEL_FOLDERS = ("models", "runs")  # `stylevar convert --out models/...` (README), training's `--out runs/...`
FORMAT_VERSION = 1


class ModelDirError(FileNotFoundError):
    """A model directory that is missing or incomplete."""


def missing_model_files(path: Path) -> list[str]:
    """The files of a model directory (`MODEL_FILES`) that `path` lacks."""
    return [name for name in MODEL_FILES if not (path / name).is_file()]


def check_model_files(path: str | os.PathLike) -> Path:
    """``path`` if it holds every file of a model directory; else a ModelDirError with the likely fix."""
    given, path = os.fspath(path), Path(path)
    missing = missing_model_files(path)
    if missing:
        what = ("no such folder" if not path.exists() else "a file, not a folder" if path.is_file()
                else f"missing {', '.join(missing)}")
        raise ModelDirError(f"no usable model at {path}: {what}. {model_dir_hint(given)}")
    return path


def names_a_hub_repository(given: str) -> bool:
    """``given`` is written exactly as a Hub repository, ``OWNER/NAME``, and is no local path (nothing here is
    named so, and OWNER is none of `LOCAL_MODEL_FOLDERS`)."""
    if not looks_like_repo_id(given) or Path(given).exists():
        return False
    owner = given.split("/", 1)[0]
    return not Path(owner).exists() and owner not in LOCAL_MODEL_FOLDERS


def model_dir_hint(given: str) -> str:
    """What the user probably meant by a ``--model`` (as given) that is not a model directory."""
    path = Path(given)
    if path.resolve() == DEMO_MODEL_DIR.resolve():
        return ("The embedded demo model is not built yet: run `scripts/train_demo_model.sh` to make it, or pass "
                "another model directory (--model DIR; the service also reads STYLEVAR_MODEL_DIR).")
    if path.is_dir() and not missing_model_files(path / "final"):
        return f"It is a training run; its model is {path / 'final'} (--model {path / 'final'})."
    if path.is_file():
        if not missing_model_files(path.parent):
            return f"It is one file of a model directory; the model is {path.parent} (--model {path.parent})."
        if path.suffix in (".pth", ".pt", ".safetensors"):
            return ("A checkpoint file: `stylevar convert --vae VAE.pth --model STYLEVAR.pth --preset d20 --out "
                    "DIR` makes a model directory of published checkpoints (then --model DIR).")
    if names_a_hub_repository(given):
        return (f"A published model on the Hugging Face Hub is written {PREFIX}OWNER/NAME: --model {PREFIX}{given} "
                "(pulled on first use).")
    return ("A model directory comes from a training run (RUN/final/), `stylevar convert`, `stylevar pull` or "
            "`StylePipeline.save_pretrained(DIR)`; pass it with --model DIR (the service also reads "
            "STYLEVAR_MODEL_DIR), or a published model as --model hf:OWNER/NAME.")


def _steps() -> tuple[type[Refinement], type[Palette], type[Upsampling]]:
    """The output steps' settings that config.json holds (their modules import torch, so on first use)."""
    from stylevar.processing.palette import Palette
    from stylevar.processing.refine import Refinement
    from stylevar.processing.upsample import Upsampling
    return Refinement, Palette, Upsampling


@dataclass
class PipelineConfig:
    tokenizer: VQVAEConfig
    transformer: StyleVARConfig
    name: str = "stylevar"
    demo: bool = False
    generation: dict[str, Any] = field(default_factory=dict)  # recommended settings; a caller's explicit value wins
    # the output steps (stylevar.processing.refine, .palette, .upsample): off or default unless config.json asks
    refine: Refinement = field(default_factory=lambda: _steps()[0]())
    palette: Palette = field(default_factory=lambda: _steps()[1]())
    upsample: Upsampling = field(default_factory=lambda: _steps()[2]())
    extra: dict[str, Any] = field(default_factory=dict)  # provenance: training settings, dates, metrics

    @property
    def label(self) -> str:
        return DEMO_LABEL if self.demo else self.name

    def to_dict(self) -> dict[str, Any]:
        return {"format": "stylevar", "format_version": FORMAT_VERSION, "name": self.name, "demo": self.demo,
                "tokenizer": self.tokenizer.to_dict(), "transformer": self.transformer.to_dict(),
                "generation": self.generation, **({"refine": self.refine.to_dict()} if self.refine.enabled else {}),
                **({"palette": self.palette.to_dict()} if self.palette.enabled else {}),
                **({"upsample": self.upsample.to_dict()} if self.upsample != _steps()[2]() else {}),
                "extra": self.extra}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PipelineConfig:
        if d.get("format") != "stylevar":
            raise ValueError("config.json is not a StyleVAR model config (missing \"format\": \"stylevar\")")
        refinement, palette, upsampling = _steps()
        return cls(VQVAEConfig.from_dict(d["tokenizer"]), StyleVARConfig.from_dict(d["transformer"]),
                   name=d.get("name", "stylevar"), demo=bool(d.get("demo", False)),
                   generation=dict(d.get("generation", {})), refine=refinement.from_dict(d.get("refine")),
                   palette=palette.from_dict(d.get("palette")), upsample=upsampling.from_dict(d.get("upsample")),
                   extra=d.get("extra", {}))

    @classmethod
    def from_dir(cls, model_dir: str | os.PathLike) -> PipelineConfig:
        """The config.json of a model directory."""
        from stylevar.models.pretrained import read_config
        return cls.from_dict(read_config(model_dir))


def check_model_dir(path: str | os.PathLike) -> PipelineConfig:
    """The config of the whole model directory at ``path``. A missing folder or file is a ModelDirError naming
    it, with the likely fix (`check_model_files`); a config.json that is not a StyleVAR one a ValueError."""
    return PipelineConfig.from_dir(check_model_files(path))


def write_model_dir(model: StyleVAR, config: PipelineConfig, folder: str | os.PathLike,
                    dtype: torch.dtype | None = None, model_card: str | None = None) -> Path:
    """Write the models' files (floats cast to `dtype` when given), config.json and the model card when given;
    returns the folder. A model prepared for inference is refused before anything is written."""
    from stylevar.models.pretrained import write_config
    from stylevar.utils.atomic import atomic_write_text
    d = model.save_pretrained(folder, dtype)
    model.tokenizer.save_pretrained(d, dtype)
    write_config(d, config.to_dict())
    if model_card is not None:
        atomic_write_text(d / "README.md", model_card)
    return d
