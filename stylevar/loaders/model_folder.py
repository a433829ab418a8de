"""Whether a folder is a whole model directory, and what the user probably meant by a ``--model`` that is not one
(a training run's ``final/``, a Hub repository written without ``hf:``, the demo model not built yet). No torch:
the command line checks ``--model`` with it before importing the model code (`stylevar.loaders.model_dir` checks
the same way when it loads one)."""
from __future__ import annotations

import os
from pathlib import Path

from stylevar.loaders.hub import PREFIX, looks_like_repo_id
from stylevar.models.files import CONFIG_FILE, TOKENIZER_FILE, TRANSFORMER_FILE

DEMO_MODEL_DIR = Path(__file__).resolve().parents[1] / "assets" / "demo"
MODEL_FILES = (CONFIG_FILE, TOKENIZER_FILE, TRANSFORMER_FILE)
LOCAL_MODEL_FOLDERS = ("models", "runs")  # `stylevar convert --out models/...` (README), training's `--out runs/...`


class ModelDirError(FileNotFoundError):
    """A model directory that is missing or incomplete."""


def missing_model_files(path: Path) -> list[str]:
    """The files of a model directory (`MODEL_FILES`) that `path` lacks."""
    return [name for name in MODEL_FILES if not (path / name).is_file()]


def check_model_files(path: str | os.PathLike) -> Path:
    """``path`` if it holds every file of a model directory; else a ModelDirError naming the folder and what it
    lacks, with the likely fix (`model_dir_hint`)."""
    given, path = os.fspath(path), Path(path)
    missing = missing_model_files(path)
    if missing:
        what = "no such folder" if not path.exists() else f"missing {', '.join(missing)}"
        raise ModelDirError(f"no usable model at {path}: {what}. {model_dir_hint(given)}")
    return path


def names_a_hub_repository(given: str) -> bool:
    """``given`` is written exactly as a Hub repository, ``OWNER/NAME`` (nothing like ``./``, ``~``, a third part
    or a trailing ``/``), and is no local path: nothing here is named OWNER or NAME, and OWNER is not one of the
    folders the project's commands write models into (`LOCAL_MODEL_FOLDERS`)."""
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
    if names_a_hub_repository(given):
        return (f"A published model on the Hugging Face Hub is written {PREFIX}OWNER/NAME: --model {PREFIX}{given} "
                "(pulled on first use).")
    return ("A model directory comes from a training run (RUN/final/), `stylevar convert`, `stylevar pull` or "
            "`StylePipeline.save_pretrained(DIR)`; pass it with --model DIR (the service also reads "
            "STYLEVAR_MODEL_DIR), or a published model as --model hf:OWNER/NAME.")
