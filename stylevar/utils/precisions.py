"""The inference precisions of `stylevar.runtime.inference.prepare`, without torch (the command line's --help, the
service's settings and the benchmarks read them), the precisions that were removed, each with why, and the precision
policy every path follows (docs/gpus.md, "Precision policy").

The policy, under any autocast (bf16 "auto" on CUDA, a bf16 precision, training's --precision, validation):
- the tokenizer's encode, quantizer (codebook search, Phi convs, f_hat) and decode run in float32 (`full_precision`),
  so the tokens of an image, the condition streams and the decoded picture do not depend on the path (the Python
  call, the command line, the service's conditions and their cache, training's encode and validation);
- the norms run in float32 where CUDA's autocast keeps them (layer_norm, normalize); what comes out of them is cast
  to the autocast dtype once where it is stored (the attention's keys, values and precomputed guide queries, the KV
  cache), not at every call;
- the rest follows autocast (the matrix products in the lower precision).
`stylevar.runtime.cuda_autocast` applies CUDA autocast's op lists on the CPU, so tests see what a GPU runs.

int8 (dynamic int8 quantisation of the transformer's linear layers) is not offered: its non-deprecated
implementation (torchao) is slower than fp32 on the model's linear shapes on the CPU, while bf16 is both faster
and closer to fp32 (benchmarks/README.md, "CPU inference, stage by stage", has the figures).
"""
from __future__ import annotations

import functools

PRECISIONS = ("fp32", "bf16")
REMOVED_PRECISIONS = {
    "int8": "int8 was removed: its non-deprecated implementation (torchao) is slower than fp32 on the CPU; use bf16",
}


def precision_error(name: object) -> str | None:
    """Why ``name`` is not an inference precision, naming the valid ones (and why, for a removed one); None
    when it is one."""
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


def _float32(value):
    """A floating tensor as float32; anything else as it is."""
    import torch

    return value.float() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def full_precision(method):
    """``method`` run in float32 whatever autocast is on around it (the precision policy, module doc): autocast off
    on its tensors' device, its floating tensor arguments cast to float32. Wraps the tokenizer's entry points."""

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
