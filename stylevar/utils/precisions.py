"""The inference precisions of `stylevar.runtime.inference.prepare`, without torch (the command line's --help, the
service's settings and the benchmarks read them), and the precisions that were removed, each with why.

int8 (dynamic int8 quantisation of the transformer's linear layers) is not offered: its non-deprecated
implementation (torchao) is slower than fp32 on the model's linear shapes on the CPU, while bf16 is both faster
and closer to fp32 (benchmarks/README.md, "CPU inference, stage by stage", has the figures).
"""
from __future__ import annotations

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
