"""The numeric precision of a run: ``--precision`` resolved for the device, autocast and loss scaling.

Importing this module does not import torch (the recipes' ``--help`` reads :data:`PRECISIONS`)."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from stylevar.utils.devices import parse_dtype

if TYPE_CHECKING:
    import torch

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}")
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("fp16 needs CUDA; use fp32 or bf16 on CPU")
    return precision


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast context for a resolved precision ("fp32" -> no autocast)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    import torch

    return torch.autocast(device_type=device.type, dtype=parse_dtype(precision))


def make_grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler, enabled only for fp16."""
    import torch

    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")
