"""The matmul precision of the process (ARCHITECTURE.md's one device policy), set by every entry point (the service,
the `stylevar` commands that run a model, the training recipes, the benchmarks' device scripts) through
`set_matmul_precision`, and the one product that stays exact under it (`strict_addmm_`).

On CUDA, float32 matrix products and convolutions run in TF32 (10-bit mantissas in, float32 sums: the tensor
cores' rate, as the reference runs): the fp32 paths (GRPO's policy and reference passes, ``--precision fp32``,
``bench --fp32``) would otherwise run full-fp32 products at a fraction of an H100's speed. CPU products are not
touched (oneDNN's own fp32 setting stays "none"): the CPU's tokens are the golden ones. The quantizer's
nearest-code distances never run in TF32 (`strict_addmm_`): a distance rounded to TF32 picks another code at
near-ties, and the GPU's tokens would drift from the CPU's golden tokens.

Importing this module does not import torch (the command line's --help stays fast); the functions do.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def set_matmul_precision(tf32: bool = True) -> None:
    """TF32 for CUDA's float32 matrix products (cuBLAS) and convolutions (cuDNN) when ``tf32``, else strict
    IEEE float32 for both (a device run comparing CUDA's tokens with the CPU's golden ones turns it off).
    Process-wide; nothing changes on the CPU."""
    import torch

    # the legacy switches, not the fp32_precision ones: torch refuses to read the matmul precision once the two
    # APIs are mixed, and torch.compile's Inductor reads it through the legacy one
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def strict_addmm_(out_NV: "torch.Tensor", a_NC: "torch.Tensor", b_CV: "torch.Tensor",
                  alpha: float = 1.0) -> "torch.Tensor":
    """``out += alpha * a @ b`` in place, never in TF32 nor under autocast, whatever `set_matmul_precision`
    chose: on CUDA the product runs in float64 (which neither TF32 nor autocast touches) and is rounded to
    float32, at least as exact as a strict float32 product; elsewhere it is the plain float32 ``addmm_``."""
    import torch

    if out_NV.device.type != "cuda":
        return out_NV.addmm_(a_NC, b_CV, alpha=alpha, beta=1)
    return out_NV.add_(torch.mm(a_NC.double(), b_CV.double()).to(out_NV.dtype), alpha=alpha)
