"""Reading a state dict from a file and checking it against a model: the one place for both.

`read_file` reads safetensors or ``torch.load(weights_only=True)`` files onto the CPU; `check_state_dict` raises
one error naming every missing, unexpected and wrongly shaped key.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

StateDict = dict[str, torch.Tensor]
_LIST_LIMIT = 12
# buffers recomputed from the config, never trusted from a file (the reference's and BatchNorm's counters)
DERIVED_KEYS = re.compile(r"(^|\.)(lvl_1L|attn_bias_for_masking|zero_k_bias\w*|num_batches_tracked)$")


class CheckpointError(ValueError):
    """A checkpoint or weight file that cannot be used (unreadable, wrong layout or shapes, LoRA-only)."""


class WeightMismatchError(CheckpointError):
    """A state dict whose keys or shapes are not the expected layout (`missing`, `unexpected`, `wrong_shape`)."""

    def __init__(self, source: str, missing: Sequence[str], unexpected: Sequence[str],
                 wrong_shape: Sequence[str | tuple[str, tuple[int, ...], tuple[int, ...]]]):
        self.source = source
        self.missing, self.unexpected = list(missing), list(unexpected)
        self.wrong_shape = [w if isinstance(w, str) else self.shape_line(*w) for w in wrong_shape]
        super().__init__(self.describe())

    @staticmethod
    def shape_line(key: str, got: tuple[int, ...], want: tuple[int, ...]) -> str:
        return f"{key}: file {got} vs expected {want}"

    def describe(self) -> str:
        parts = []
        for label, keys in (("missing keys", self.missing), ("unexpected keys", self.unexpected),
                            ("wrong shapes", self.wrong_shape)):
            if keys:
                shown = ", ".join(keys[:_LIST_LIMIT])
                more = f", ... and {len(keys) - _LIST_LIMIT} more" if len(keys) > _LIST_LIMIT else ""
                parts.append(f"{label} ({len(keys)}): {shown}{more}")
        return f"{self.source} does not have the expected layout:\n  " + "\n  ".join(parts)


class CheckpointMismatchError(WeightMismatchError):
    """A checkpoint that does not fit the model built from the config (worded for checkpoints)."""

    @staticmethod
    def shape_line(key: str, got: tuple[int, ...], want: tuple[int, ...]) -> str:
        return f"{key}: checkpoint {got} vs model {want}"

    def describe(self) -> str:
        lines = [f"checkpoint does not fit {self.source}:"]
        for title, items in (("missing keys", self.missing), ("unexpected keys", self.unexpected),
                             ("shape mismatches", self.wrong_shape)):
            if items:
                shown = ", ".join(items[:12]) + (f", ... ({len(items)} in all)" if len(items) > 12 else "")
                lines.append(f"  {title}: {shown}")
        return "\n".join(lines)


def read_file(path: str | os.PathLike, *, what: str = "weight file") -> object:
    """What a `.safetensors` or torch file holds, on the CPU. `what` names the file in the errors:
    FileNotFoundError ("{what} not found: PATH") and CheckpointError ("cannot read {what} PATH: ...")."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path), device="cpu")
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):
                raise
            return torch.load(path, map_location="cpu", weights_only=True)  # legacy (non-zip) serialisation
    except Exception as e:  # noqa: BLE001 - unpickling and safetensors errors come in many types
        raise CheckpointError(f"cannot read {what} {path}: {type(e).__name__}: {e}") from e


def is_state_dict(obj: object) -> bool:
    return isinstance(obj, Mapping) and all(isinstance(v, torch.Tensor) for v in obj.values())


def read_state_dict(path: str | os.PathLike, *, key: str | None = None, what: str = "weight file") -> StateDict:
    """The state dict in a file (see `read_file`); `key` selects a nested one (e.g. "state_dict")."""
    obj = read_file(path, what=what)
    if key is not None:
        if not isinstance(obj, Mapping) or key not in obj:
            raise WeightMismatchError(str(path), [key], [], [])
        obj = obj[key]
    if not is_state_dict(obj):
        raise CheckpointError(f"{path} does not hold a state dict (a mapping of names to tensors)")
    return dict(obj)  # type: ignore[arg-type]


def check_state_dict(state_dict: Mapping[str, torch.Tensor],
                     expected: Mapping[str, torch.Tensor | torch.Size | tuple[int, ...]], *, source: str,
                     allow_unexpected: bool = False, error: type[WeightMismatchError] = WeightMismatchError) -> None:
    """Raise `error` (a WeightMismatchError) listing every missing, unexpected and wrongly shaped key of
    `state_dict` against `expected` (a model's state dict, or the shapes). `source` names the file."""

    def shape(v) -> tuple[int, ...]:
        return tuple(v.shape) if isinstance(v, torch.Tensor) else tuple(v)

    missing = [k for k in expected if k not in state_dict]
    unexpected = [] if allow_unexpected else [k for k in state_dict if k not in expected]
    wrong = [(k, shape(state_dict[k]), shape(expected[k])) for k in expected
             if k in state_dict and shape(state_dict[k]) != shape(expected[k])]
    if missing or unexpected or wrong:
        raise error(source, missing, unexpected, wrong)


def read_checked(path: str | os.PathLike, expected: Mapping[str, torch.Tensor | torch.Size | tuple[int, ...]], *,
                 source: str | None = None, key: str | None = None, allow_unexpected: bool = False) -> StateDict:
    """`read_state_dict` then `check_state_dict` against `expected` (`source` defaults to the path)."""
    sd = read_state_dict(path, key=key)
    check_state_dict(sd, expected, source=source or str(path), allow_unexpected=allow_unexpected)
    return sd


def load_into(module: torch.nn.Module, path: str | os.PathLike, *, source: str | None = None) -> None:
    """Strictly load a state-dict file into `module` after checking its keys and shapes."""
    module.load_state_dict(read_checked(path, module.state_dict(), source=source), strict=True)


def fit_state_dict(sd: StateDict, own: StateDict, what: str) -> StateDict:
    """``sd`` with its derived buffers taken from the model's ``own``, checked against it (naming ``what``)."""
    out = {k: v for k, v in sd.items() if not DERIVED_KEYS.search(k)}
    for k, v in own.items():
        if DERIVED_KEYS.search(k):
            out[k] = v
    check_state_dict(out, own, source=what, error=CheckpointMismatchError)
    return out
