"""The compile policy: how the transformer's blocks go through `torch.compile`, for every entry point.

Each block's `Block.step` is compiled, every block sharing one set of graphs; shapes are automatic dynamic, so a
batch size is not a recompile. `GraphCount` is the backend, counting the graphs it is handed.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from stylevar.utils.devices import import_compiler_quietly

RECOMPILE_LIMIT = 64
WARM_BATCHES = (1, 2)  # after a batch of 1 and one of 2, every batch size runs graphs already compiled
BACKENDS = ("inductor", "eager")


@dataclass
class GraphCount:
    """A torch.compile backend: ``backend`` (a name dynamo knows) compiling each graph, and how many it compiled."""

    backend: str = "inductor"
    graphs: int = 0

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"compile backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}")

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.graphs += 1
        return torch._dynamo.lookup_backend(self.backend)(gm, example_inputs)


def compiled(model) -> GraphCount | None:
    """The `GraphCount` a model's blocks were compiled with, or None (eager)."""
    return getattr(model, "compile_count", None)


def compile_blocks(model, backend: str = "inductor", options: dict | None = None) -> GraphCount:
    """Every block's `step` through torch.compile, in place; returns the graph count (ValueError if compiled).
    ``options``: Inductor's config while these blocks are traced, compiled and run (``{"freezing": True}`` makes each
    block's weights constants of graphs of its own)."""
    earlier = compiled(model)
    if earlier is not None:
        raise ValueError(f"the blocks are compiled already (backend {earlier.backend})")
    if options and backend != "inductor":
        raise ValueError(f"compile options are Inductor's; the {backend} backend takes none")
    import torch._inductor.config as inductor_config
    import_compiler_quietly()  # no "No CUDA runtime is found" on a machine without a usable GPU
    count = GraphCount(backend)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    inductor_config.fallback_random = True
    for blk in model.blocks:
        step = torch.compile(blk.step, backend=count, dynamic=None)
        blk.step = _configured(step, options) if options else step
    model.compile_count = count
    return count


def _configured(step: Callable, options: dict) -> Callable:
    """``step`` called under Inductor's ``options``: dynamo reads some of them (freezing) while it traces, before
    any backend sees the graph, so torch.compile's own ``options`` would not reach them."""
    import torch._inductor.config as inductor_config

    @functools.wraps(step)
    def run(*args, **kwargs):
        with inductor_config.patch(options):
            return step(*args, **kwargs)
    return run


def recompile_limit_hits() -> int:
    """How often dynamo hit a recompile limit in this process (the code it hit it on runs eagerly from then on)."""
    from torch._dynamo.utils import counters
    return sum(n for msg, n in counters["unimplemented"].items() if "recompile limit" in msg.lower())
