"""Optional compilation of the per-scale transformer step (the CUDA fast path; works on CPU too)."""
from __future__ import annotations

import torch

from stylevar.models.transformer.model import StyleVAR
from stylevar.utils.devices import import_compiler_quietly


def compile_model(model: StyleVAR, mode: str | None = None, dynamic: bool = False) -> StyleVAR:
    """torch.compile every block in place. Generation calls a block with K token counts and teacher
    forcing with one more, so each block compiles K + 1 static graphs, once per batch size."""
    import_compiler_quietly()  # no "No CUDA runtime is found" on a machine without a usable GPU
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 4 * len(model.cfg.patch_nums))
    for blk in model.blocks:
        blk.compile(mode=mode, dynamic=dynamic)
    return model
