"""Device names a user passes (`--device cuda:1`): parsed and checked before any model is built.

No torch at import. An automatic choice with a GPU that torch cannot use goes to the CPU with one warning.
"""
from __future__ import annotations

import glob
import logging
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_CUDA_NAME = re.compile(r"^cuda(?::(\d+))?$")
# what a GPU driver leaves on Linux (NVIDIA, AMD ROCm, WSL2): none of them, no CUDA device can be available
_GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia[0-9]*", "/proc/driver/nvidia/gpus/*", "/dev/kfd", "/dev/dxg")
_NVIDIA_DRIVER_VERSION = "/proc/driver/nvidia/version"

log = logging.getLogger(__name__)


class DeviceError(ValueError):
    """A device that is not a device name, or that this machine does not have."""


def _gpu_nodes() -> list[str]:
    """The GPU driver's device nodes found here (Linux; elsewhere none can be looked for)."""
    if not sys.platform.startswith("linux"):
        return []
    return [node for pattern in _GPU_NODES for node in glob.glob(pattern)]


def _no_gpu_driver() -> bool:
    """True only when it is certain that no CUDA device exists (Linux without any GPU driver node)."""
    return sys.platform.startswith("linux") and not _gpu_nodes()


def driver_version() -> str:
    """The NVIDIA kernel driver's version line (Linux), or "not readable"."""
    try:
        with open(_NVIDIA_DRIVER_VERSION) as f:
            return f.readline().strip()
    except OSError:
        return "not readable"


def cuda_unusable_reason() -> str | None:
    """Why torch cannot use the GPU this machine has, from torch's own error; None when it can or there is none."""
    import torch
    nodes = _gpu_nodes()
    if not nodes or torch.cuda.is_available():
        return None
    build = f"torch {torch.__version__} (built for CUDA {torch.version.cuda or 'none: a CPU-only build'})"
    try:
        torch.cuda.init()
        error = "torch finds no CUDA device"
    except (RuntimeError, AssertionError) as e:  # torch's init error: an old driver, no device, no CUDA build
        error = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return (f"this machine has a GPU driver ({nodes[0]}; driver: {driver_version()}) but {build} cannot use it: "
            f"{error}. Install a torch build for a CUDA that the driver supports (`nvidia-smi` shows the highest; "
            f"docs/gpus.md), or choose the CPU explicitly (--device cpu)")


def _auto_device() -> "torch.device":
    """CUDA if torch can use it, else the CPU, with a warning when a GPU is present but unusable."""
    import torch
    if torch.cuda.is_available():
        return torch.device("cuda")
    reason = cuda_unusable_reason()
    if reason:
        log.warning("device auto: running on the CPU: %s", reason)
    return torch.device("cpu")


def check_device(name: str | None) -> str | None:
    """``name`` unchanged if this machine can run on it (None: choose automatically); else DeviceError. CUDA on a
    machine without any GPU driver is refused without importing torch."""
    if name is None or name == "cpu":
        return name
    if _CUDA_NAME.match(name) and _no_gpu_driver():
        raise DeviceError(f"device {name!r} is not available: this machine has no GPU driver (use --device cpu)")
    resolve_device(name)
    return name


def resolve_device(name: str | None) -> "torch.device":
    """The torch.device for ``name`` (None: CUDA if available, else the CPU), checked to exist here."""
    import torch
    if name is None:
        return _auto_device()
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as e:
        raise DeviceError(f"{name!r} is not a device name (examples: cpu, cuda, cuda:1, mps)") from e
    if device.type == "cpu":
        return device
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise DeviceError(f"device {name!r} is not available: torch finds no CUDA device (use --device cpu)")
        if device.index is not None and device.index >= count:
            raise DeviceError(f"device {name!r} is not available: this machine has {count} CUDA device(s) "
                              f"(cuda:0 .. cuda:{count - 1})")
        return device
    backend = getattr(torch.backends, device.type, None) or getattr(torch, device.type, None)
    available = getattr(backend, "is_available", None)
    if available is None or not available():
        raise DeviceError(f"device {name!r} is not available on this machine (use --device cpu)")
    return device


def resolve_devices(names: Sequence[str]) -> "list[torch.device]":
    """Several devices: ``["auto"]`` -> every visible CUDA device, else the CPU; otherwise each checked."""
    import torch
    if list(names) == ["auto"]:
        if _auto_device().type == "cuda":
            return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
        return [torch.device("cpu")]
    return [resolve_device(n) for n in names]


def import_compiler_quietly() -> None:
    """Import torch's C++ extension loader without its import-time "No CUDA runtime is found" warning."""
    if "torch.utils.cpp_extension" in sys.modules:
        return
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import torch.utils.cpp_extension  # noqa: F401
    finally:
        logger.setLevel(level)
