"""Dense bf16 tensor-core peaks of common NVIDIA GPUs (TFLOP/s, without sparsity, from NVIDIA's data sheets), picked
by the name torch or nvidia-smi gives, for the MFU of `stylevar bench` and `benchmarks.train_step`. A GPU not in the
table has no peak: no MFU is reported rather than a wrong one.

    python -m benchmarks.gpu_peaks                  # this machine's GPU 0: its peak, or nothing (exit 0 either way)
    python -m benchmarks.gpu_peaks "NVIDIA H100 PCIe"
"""
from __future__ import annotations

import argparse
import re
import sys

# (pattern on the device name, TFLOP/s): the first match wins, so each variant comes before its family
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    (r"\bH100\b.*\bPCIe\b", 756.0),
    (r"\bH100\b.*\bNVL\b", 835.0),
    (r"\bH200\b.*\bNVL\b", 835.0),
    (r"\bH100\b", 989.0),  # SXM ("NVIDIA H100 80GB HBM3")
    (r"\bH200\b", 989.0),  # SXM
    (r"\bGH200\b", 989.0),
    (r"\bB200\b", 2250.0),
    (r"\bA100\b", 312.0),
    (r"\bA800\b", 312.0),
    (r"\bL40S\b", 362.0),
    (r"\bL40\b", 181.0),
    (r"\bL4\b", 121.0),
    (r"\bA10\b", 125.0),
    (r"\bA6000\b", 155.0),  # RTX A6000
)


def peak_tflops(name: str) -> float | None:
    """The dense bf16 peak of the GPU called ``name`` (e.g. "NVIDIA H100 80GB HBM3"), None when unknown."""
    for pattern, tflops in PEAK_BF16_TFLOPS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return tflops
    return None


def current_gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_peaks", description=__doc__.split("\n")[0])
    p.add_argument("name", nargs="?", default=None,
                   help="a GPU's name as CUDA gives it (default: this machine's first GPU)")
    name = p.parse_args(argv).name or current_gpu_name()
    peak = peak_tflops(name) if name else None
    if peak is not None:
        print(f"{peak:g}")
    else:
        print(f"gpu_peaks: no known bf16 peak for {name or 'this machine (no CUDA device)'}: no MFU", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
