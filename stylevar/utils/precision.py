"""The precision policy for every path: the precision names that inference and training accept (`precision_setting`:
the inference precision asked for, or STYLEVAR_PRECISION), the matmul precision (TF32 on CUDA), and what stays
float32 under any autocast (`full_precision`, `strict_addmm_`). `cuda_like_autocast` applies CUDA autocast's
operator lists on the CPU. Importing it does not import torch.
"""
from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# inference (`stylevar.runtime.inference.prepare`); "auto" settles on fp32 or bf16 where the model runs
PRECISIONS = ("auto", "fp32", "bf16")
PRECISION_ENV = "STYLEVAR_PRECISION"  # the service's setting, and the command line's default
REMOVED_PRECISIONS = {
    "int8": "int8 was removed: its non-deprecated implementation (torchao) is slower than fp32 on the CPU; use bf16",
}
TRAINING_PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # the recipes' --precision
# every spelling of a dtype the project's settings accept (the service: float32/bfloat16/float16; training: fp32/...)
DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
               "float16": "float16", "fp16": "float16"}


def precision_error(name: object) -> str | None:
    """Why ``name`` is not an inference precision, naming the valid ones; None when it is one."""
    if name in PRECISIONS:
        return None
    valid = ", ".join(PRECISIONS)
    why = REMOVED_PRECISIONS.get(name) if isinstance(name, str) else None
    if why:
        return f"precision {name!r}: {why} (valid precisions: {valid})"
    return f"precision must be one of {valid}, not {name!r}"


def check_precision(name: object) -> str:
    """``name`` when it is an inference precision, else a ValueError saying why (`precision_error`)."""
    error = precision_error(name)
    if error:
        raise ValueError(error)
    return name  # type: ignore[return-value]


def precision_setting(value: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The inference precision to run: ``value`` when given, else `PRECISION_ENV` when set, else "auto"; a name
    that is not one is a ValueError saying why (`precision_error`)."""
    if value is not None:
        return check_precision(value)
    text = (os.environ if environ is None else environ).get(PRECISION_ENV, "").strip()
    if text and (error := precision_error(text)):
        raise ValueError(f"{PRECISION_ENV}: {error}")
    return text or "auto"


def parse_dtype(name: str) -> torch.dtype:
    """The torch dtype for a name in `DTYPE_NAMES` ("bf16" -> torch.bfloat16); ValueError for any other."""
    import torch
    if name not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {name!r}; one of {', '.join(DTYPE_NAMES)}")
    return getattr(torch, DTYPE_NAMES[name])


def resolve_autocast_dtype(name: str | torch.dtype | None, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``device`` (None: float32); "auto": bfloat16 on a CUDA device that supports it."""
    import torch
    if name is None or isinstance(name, torch.dtype):
        dtype = name
    elif name == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None
    else:
        dtype = parse_dtype(name)
    return None if dtype == torch.float32 else dtype


def resolve_precision(precision: str, device: torch.device) -> str:
    """A recipe's --precision for ``device``: "auto" is bf16 on CUDA and fp32 elsewhere; fp16 needs CUDA."""
    if precision not in TRAINING_PRECISIONS:
        raise ValueError(f"precision must be one of {TRAINING_PRECISIONS}")
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


def set_matmul_precision(tf32: bool = True) -> None:
    """TF32 for CUDA's float32 matrix products and convolutions when ``tf32``, else strict float32 (process-wide)."""
    import torch

    # the legacy switches: torch refuses to read the precision once the two APIs are mixed, and Inductor reads these
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def strict_addmm_(out_NV: torch.Tensor, a_NC: torch.Tensor, b_CV: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """``out += alpha * a @ b`` in place, never in TF32 nor under autocast (on CUDA in float64, rounded to
    float32), so that near-ties pick the same code everywhere."""
    import torch
    if out_NV.device.type != "cuda":
        return out_NV.addmm_(a_NC, b_CV, alpha=alpha, beta=1)
    return out_NV.add_(torch.mm(a_NC.double(), b_CV.double()).to(out_NV.dtype), alpha=alpha)


def _float32(value):
    """A floating tensor as float32; anything else as it is."""
    import torch
    return value.float() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def full_precision(method):
    """``method`` run in float32 whatever autocast is on around it (wraps the tokenizer's entry points)."""

    @functools.wraps(method)
    def in_float32(*args, **kwargs):
        import torch
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        device_type = tensors[0].device.type if tensors else "cpu"
        args, kwargs = tuple(map(_float32, args)), {k: _float32(v) for k, v in kwargs.items()}
        if not torch.amp.is_autocast_available(device_type):  # the meta device (sizing): no autocast to leave
            return method(*args, **kwargs)
        with torch.autocast(device_type, enabled=False):
            return method(*args, **kwargs)

    return in_float32


@functools.cache
def _cuda_op_lists() -> tuple[frozenset, frozenset, frozenset]:
    """CUDA autocast's operator lists: those cast to the lower precision, to float32, and to the widest input type."""
    import torch
    import torch.nn.functional as F
    T = torch.Tensor
    lower = frozenset({
        F.linear, torch.matmul, T.matmul, T.__matmul__, T.__rmatmul__, torch.mm, T.mm, torch.bmm, T.bmm, torch.mv,
        T.mv, torch.addmm, T.addmm, torch.baddbmm, T.baddbmm, torch.addbmm, T.addbmm, torch.addmv, T.addmv,
        torch.addr, T.addr, torch.chain_matmul, torch.linalg.multi_dot, torch.conv1d, torch.conv2d, torch.conv3d,
        torch.conv_transpose1d, torch.conv_transpose2d, torch.conv_transpose3d, torch.prelu, F.prelu,
        F.scaled_dot_product_attention, torch.einsum,
    })
    float32 = frozenset({
        T.__pow__, T.__rpow__, T.__rtruediv__, torch.acos, T.acos, torch.asin, T.asin, torch.cosh, T.cosh,
        torch.sinh, T.sinh, torch.tan, T.tan, torch.erfinv, T.erfinv, torch.exp, T.exp, torch.expm1, T.expm1,
        torch.log, T.log, torch.log10, T.log10, torch.log1p, T.log1p, torch.log2, T.log2, torch.reciprocal,
        T.reciprocal, torch.rsqrt, T.rsqrt, torch.pow, T.pow, torch.sum, T.sum, torch.prod, T.prod, torch.cumsum,
        T.cumsum, torch.cumprod, T.cumprod, torch.softmax, T.softmax, F.softmax, F.softmin, torch.log_softmax,
        T.log_softmax, F.log_softmax, torch.logsumexp, T.logsumexp, F.softplus, F.layer_norm, torch.layer_norm,
        F.group_norm, torch.group_norm, F.normalize, torch.norm, T.norm, torch.linalg.vector_norm,
        torch.linalg.matrix_norm, torch.renorm, T.renorm, torch.dist, T.dist, torch.cdist, F.pdist,
        F.cosine_similarity, torch.cosine_similarity, F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss,
        F.cross_entropy, F.nll_loss, F.kl_div, F.binary_cross_entropy_with_logits, F.poisson_nll_loss,
        F.hinge_embedding_loss, F.cosine_embedding_loss, F.margin_ranking_loss, F.multilabel_margin_loss,
        F.multi_margin_loss, F.soft_margin_loss, F.triplet_margin_loss,
    })
    widest = frozenset({
        torch.addcdiv, T.addcdiv, torch.addcmul, T.addcmul, torch.atan2, T.atan2, F.bilinear, torch.cross, T.cross,
        torch.dot, T.dot, F.grid_sample, T.index_put, torch.index_put, torch.scatter_add, T.scatter_add,
        torch.tensordot,
    })
    return lower, float32, widest


def _cuda_like_call(func, args, kwargs):
    """``func`` called as CUDA's autocast would in the current CPU autocast region's dtype (float64 never cast)."""
    import torch
    from torch.utils._pytree import tree_map
    if not torch.is_autocast_enabled("cpu"):  # a float32 region (or no autocast): nothing to emulate
        return func(*args, **kwargs)
    lower, float32, widest = _cuda_op_lists()
    floating = (torch.float32, torch.float16, torch.bfloat16)
    dtype = None
    if func in lower:
        dtype = torch.get_autocast_dtype("cpu")
    elif func in float32:
        dtype = torch.float32
    elif func in widest:
        found = [x.dtype for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor) and x.dtype in floating]
        dtype = max(found, key=lambda d: torch.finfo(d).bits) if found else None
    if dtype is not None:
        def cast(x):
            return x.to(dtype) if isinstance(x, torch.Tensor) and x.dtype in floating else x
        args, kwargs = tree_map(cast, args), tree_map(cast, kwargs)
    with torch.autocast("cpu", enabled=False):  # CPU autocast's own lists off: only CUDA's apply
        return func(*args, **kwargs)


@functools.cache
def _cuda_like_mode() -> type:
    """The TorchFunctionMode behind `cuda_like_casts`, defined on first use (this module imports no torch)."""
    from torch.overrides import TorchFunctionMode

    class CudaLikeMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return _cuda_like_call(func, args, kwargs or {})

    return CudaLikeMode


@contextlib.contextmanager
def cuda_like_casts() -> Iterator[None]:
    """Every CPU autocast region entered inside casts as CUDA's autocast does, in that region's dtype."""
    with _cuda_like_mode()():
        yield


@contextlib.contextmanager
def cuda_like_autocast(dtype: torch.dtype | None = None) -> Iterator[None]:
    """CPU autocast to ``dtype`` (bfloat16 by default) that casts as CUDA's autocast does (`cuda_like_casts`)."""
    import torch
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16), cuda_like_casts():
        yield
