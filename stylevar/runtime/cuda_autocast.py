"""CUDA's autocast, applied on the CPU: what a GPU computes in which dtype, visible to CPU tests and benchmarks.

CPU autocast and CUDA autocast cast different operators. On CUDA layer_norm, group_norm, the norms, softmax, exp, pow,
sum and the losses run in float32 (their outputs are float32), so whatever follows them is float32 too unless the code
casts it back; CPU autocast runs several of them in bfloat16, and a test on the CPU never sees the float32 tensors a GPU
would hold. `cuda_like_autocast(dtype)` is CPU autocast with its operator lists replaced by CUDA's (PyTorch's "Autocast
Op Reference", CUDA ops): a `TorchFunctionMode` casts the floating inputs of CUDA's lower-precision operators to
``dtype`` and those of its float32 operators to float32, promotes the widest-type operators, leaves every other
operator's dtypes alone, and runs each with CPU autocast's own casting off. A region that turns autocast off
(``torch.autocast("cpu", enabled=False)``, `stylevar.utils.precisions.full_precision`) turns this off too, as it would
CUDA's.

It works at the level of Python calls (``F.layer_norm``, ``Tensor.sum``, ``F.linear``), not of the dispatcher as CUDA's
does: a composite that reaches a listed operator only inside (``einsum`` through ``bmm``) is listed itself. It is for
checking dtypes and that a path runs, not for timing (every call passes through Python).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

T = torch.Tensor
# CUDA ops that autocast to the lower precision ("CUDA Ops that can autocast to float16"), and einsum (through bmm)
LOWER_PRECISION = frozenset({
    F.linear, torch.matmul, T.matmul, T.__matmul__, T.__rmatmul__, torch.mm, T.mm, torch.bmm, T.bmm, torch.mv, T.mv,
    torch.addmm, T.addmm, torch.baddbmm, T.baddbmm, torch.addbmm, T.addbmm, torch.addmv, T.addmv, torch.addr, T.addr,
    torch.chain_matmul, torch.linalg.multi_dot, torch.conv1d, torch.conv2d, torch.conv3d, torch.conv_transpose1d,
    torch.conv_transpose2d, torch.conv_transpose3d, torch.prelu, F.prelu, F.scaled_dot_product_attention, torch.einsum,
})
# CUDA ops that autocast to float32 ("CUDA Ops that can autocast to float32")
FLOAT32 = frozenset({
    T.__pow__, T.__rpow__, T.__rtruediv__, torch.acos, T.acos, torch.asin, T.asin, torch.cosh, T.cosh, torch.sinh,
    T.sinh, torch.tan, T.tan, torch.erfinv, T.erfinv, torch.exp, T.exp, torch.expm1, T.expm1, torch.log, T.log,
    torch.log10, T.log10, torch.log1p, T.log1p, torch.log2, T.log2, torch.reciprocal, T.reciprocal, torch.rsqrt,
    T.rsqrt, torch.pow, T.pow, torch.sum, T.sum, torch.prod, T.prod, torch.cumsum, T.cumsum, torch.cumprod, T.cumprod,
    torch.softmax, T.softmax, F.softmax, F.softmin, torch.log_softmax, T.log_softmax, F.log_softmax, torch.logsumexp,
    T.logsumexp, F.softplus, F.layer_norm, torch.layer_norm, F.group_norm, torch.group_norm, F.normalize, torch.norm,
    T.norm, torch.linalg.vector_norm, torch.linalg.matrix_norm, torch.renorm, T.renorm, torch.dist, T.dist,
    torch.cdist, F.pdist, F.cosine_similarity, torch.cosine_similarity, F.mse_loss, F.l1_loss, F.smooth_l1_loss,
    F.huber_loss, F.cross_entropy, F.nll_loss, F.kl_div, F.binary_cross_entropy_with_logits, F.poisson_nll_loss,
    F.hinge_embedding_loss, F.cosine_embedding_loss, F.margin_ranking_loss, F.multilabel_margin_loss,
    F.multi_margin_loss, F.soft_margin_loss, F.triplet_margin_loss,
})
# CUDA ops that run in the widest floating type of their inputs ("CUDA Ops that promote to the widest input type")
WIDEST = frozenset({
    torch.addcdiv, T.addcdiv, torch.addcmul, T.addcmul, torch.atan2, T.atan2, F.bilinear, torch.cross, T.cross,
    torch.dot, T.dot, F.grid_sample, T.index_put, torch.index_put, torch.scatter_add, T.scatter_add, torch.tensordot,
})
CASTABLE = (torch.float32, torch.float16, torch.bfloat16)  # autocast never casts float64


def _cast(args, kwargs, dtype: torch.dtype):
    def cast(x):
        return x.to(dtype) if isinstance(x, torch.Tensor) and x.dtype in CASTABLE else x
    return tree_map(cast, args), tree_map(cast, kwargs)


def _widest(args, kwargs) -> torch.dtype | None:
    found = [x.dtype for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor) and x.dtype in CASTABLE]
    return max(found, key=lambda d: torch.finfo(d).bits) if found else None


class CudaLikeAutocast(TorchFunctionMode):
    """Every CPU autocast region entered while this mode is on casts with CUDA's operator lists (module doc), in
    that region's dtype: the model's own autocast (``StyleVAR.autocast_dtype``) becomes CUDA's. Outside any
    autocast region it changes nothing. `cuda_like_autocast` is the mode with an autocast region around it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not torch.is_autocast_enabled("cpu"):  # a float32 region (or no autocast): nothing to emulate
            return func(*args, **kwargs)
        if func in LOWER_PRECISION:
            args, kwargs = _cast(args, kwargs, torch.get_autocast_dtype("cpu"))
        elif func in FLOAT32:
            args, kwargs = _cast(args, kwargs, torch.float32)
        elif func in WIDEST and (widest := _widest(args, kwargs)) is not None:
            args, kwargs = _cast(args, kwargs, widest)
        with torch.autocast("cpu", enabled=False):  # CPU autocast's own lists off: only CUDA's apply
            return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_like_autocast(dtype: torch.dtype = torch.bfloat16) -> Iterator[None]:
    """CPU autocast to ``dtype`` that casts as CUDA's autocast does (module doc)."""
    with torch.autocast("cpu", dtype=dtype), CudaLikeAutocast():
        yield
