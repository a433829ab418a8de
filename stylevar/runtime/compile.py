"""The compile policy (ARCHITECTURE.md's one device policy): how the transformer's blocks go through
`torch.compile`, written once for generation, the service, the benchmark and training.

- What is compiled: each block's `Block.step`, its computation. The drop-path draws stay eager in
  `Block.forward` and come in as tensors, so no graph holds a block's own constant (its rate): the blocks share
  one code object, and with it one set of graphs (dynamo keeps its graphs and its recompile limit per code
  object). A rate read inside the graph made one graph per block, and d20 generation ran into the limit and
  silently fell back to eager.
- Shapes: automatic dynamic (``dynamic=None``): a first call compiles static shapes, and a size that changes
  becomes symbolic in the graph compiled then. Generation makes one graph for its first scale (an empty KV
  cache) and one for every later scale (the token count symbolic); dynamo always specialises a size of 1, so
  batch 1 has its own pair and batch 2 makes the pair every larger batch reuses (`WARM_BATCHES`: the service
  runs both before /readyz says ready). About 4 graphs in all, against K + 1 with static shapes for each batch
  size. Training compiles one graph (train mode; the draws passed in), evaluation-mode teacher forcing one more.
- `RECOMPILE_LIMIT`: dynamo's per-code-object limit is raised to it, far above that count; a run that still
  hits it says so (`recompile_limit_hits`, reported by `stylevar bench --compile`).
- Random draws inside a graph (attention dropout, 0 in every preset) are torch's eager ones (Inductor's
  ``fallback_random``), so a compiled training run draws what an eager one does.
- `GraphCount` is the backend the blocks compile with: the real backend ("inductor", or "eager" for tests),
  counting the graphs it is handed.
"""
from __future__ import annotations

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


def compile_blocks(model, backend: str = "inductor") -> GraphCount:
    """Every block's `step` through torch.compile (module doc), in place; returns the count of the graphs they
    compile (shared by the blocks). A model compiled already is a ValueError."""
    earlier = compiled(model)
    if earlier is not None:
        raise ValueError(f"the blocks are compiled already (backend {earlier.backend})")
    import torch._inductor.config as inductor_config

    import_compiler_quietly()  # no "No CUDA runtime is found" on a machine without a usable GPU
    count = GraphCount(backend)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    inductor_config.fallback_random = True
    for blk in model.blocks:
        blk.step = torch.compile(blk.step, backend=count, dynamic=None)
    model.compile_count = count
    return count


def recompile_limit_hits() -> int:
    """How often dynamo hit a recompile limit in this process (the code it hit it on runs eagerly from then on)."""
    from torch._dynamo.utils import counters

    return sum(n for msg, n in counters["unimplemented"].items() if "recompile limit" in msg.lower())
