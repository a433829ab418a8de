"""The project's own weight format: each model saves and loads itself (`save_pretrained` / `from_pretrained`), its
weights to its own safetensors file, its config to its own section of the folder's config.json.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors.torch import save_file

from stylevar.utils.atomic import atomic_write_path, atomic_write_text
from stylevar.config import CONFIG_FILE
from stylevar.models.state_dict import StateDict, read_state_dict


def save_safetensors(sd: Mapping[str, torch.Tensor], path: str | os.PathLike, dtype: torch.dtype | None = None,
                     metadata: dict[str, str] | None = None, what: str = "weights") -> None:
    """Write a state dict atomically (floats cast to `dtype` when given); WriteFailedError naming ``what``."""
    out = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).detach().contiguous().cpu()
           for k, v in sd.items()}
    size = sum(v.numel() * v.element_size() for v in out.values())
    atomic_write_path(path, lambda tmp: _save_file(out, Path(tmp), metadata), size=size, what=what)


def _save_file(sd: Mapping[str, torch.Tensor], tmp: Path, metadata: dict[str, str] | None) -> None:
    """safetensors' writer, its failures raised as OSError (a full disk told by the space left)."""
    from safetensors import SafetensorError
    open(tmp, "wb").close()
    try:
        save_file(sd, str(tmp), metadata=metadata)
    except SafetensorError as e:
        raise OSError(str(e)) from e


def load_safetensors(path: str | os.PathLike) -> StateDict:
    """A project weights file, floating tensors as float32."""
    sd = read_state_dict(path, what="weights file")
    return {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}


def read_config(folder: str | os.PathLike) -> dict[str, Any]:
    config = json.loads((Path(folder) / CONFIG_FILE).read_text())
    if not isinstance(config, dict):
        raise ValueError(f"{Path(folder) / CONFIG_FILE} does not hold a JSON object")
    return config


def write_config(folder: str | os.PathLike, config: Mapping[str, Any]) -> None:
    """``folder/config.json`` (one space of indent, a final newline), written atomically."""
    atomic_write_text(Path(folder) / CONFIG_FILE, json.dumps(config, indent=1) + "\n")


def update_config(folder: str | os.PathLike, sections: Mapping[str, Any]) -> None:
    """Set ``sections`` in ``folder/config.json``, keeping its other entries (an unreadable one started afresh)."""
    try:
        config = read_config(folder)
    except (OSError, ValueError):
        config = {}
    write_config(folder, {**config, **sections})


class PretrainedModel:
    """Saving and loading an nn.Module with config `cfg`: weights in `weights_file`, config in `config_section`."""

    config_section: ClassVar[str]
    weights_file: ClassVar[str]

    def pretrained_state_dict(self) -> StateDict:
        """What `save_pretrained` writes (default: the whole state dict)."""
        return self.state_dict()  # type: ignore[attr-defined]

    def save_pretrained(self, folder: str | os.PathLike, dtype: torch.dtype | None = None,
                        extra: Mapping[str, Any] | None = None) -> Path:
        """Write ``<weights_file>`` (floats as `dtype`) and this model's config.json section; returns ``folder``."""
        sd = self.pretrained_state_dict()
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_safetensors(sd, folder / self.weights_file, dtype)
        update_config(folder, {self.config_section: self.cfg.to_dict(),  # type: ignore[attr-defined]
                               **({} if extra is None else {"extra": dict(extra)})})
        return folder

    @classmethod
    def read_pretrained(cls, folder: str | os.PathLike) -> tuple[dict[str, Any], StateDict]:
        """This model's config section and weights from ``folder`` (floats as float32)."""
        folder = Path(folder)
        missing = [name for name in (CONFIG_FILE, cls.weights_file) if not (folder / name).is_file()]
        if missing:
            raise FileNotFoundError(f"{folder} lacks {' and '.join(missing)}")
        config = read_config(folder)
        if not isinstance(config.get(cls.config_section), dict):
            raise ValueError(f"{folder / CONFIG_FILE} has no {cls.config_section!r} section")
        return config[cls.config_section], load_safetensors(folder / cls.weights_file)
