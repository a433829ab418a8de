"""Device memory of generation per batch size, measured on the meta device (exact shapes, no memory).

For R rows the sampling loop holds the KV cache, the guide queries of every scale and one step's peak (`LiveBytes`,
an upper bound), each linear in R; weights, encoders and the CUDA context are not counted.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from stylevar.config import DEFAULT_GENERATION, StyleVARConfig
from stylevar.models.sampling import sample
from stylevar.models.transformer.attention import KVCache
from stylevar.models.transformer.block import AdaLNHead, Block, Guide

META = torch.device("meta")


class LiveBytes(TorchDispatchMode):
    """The bytes of the tensors alive over the operations run under it, and their peak (``known`` ones not counted)."""

    def __init__(self, known: Iterable[torch.Tensor] = ()):
        super().__init__()
        self._known = {t.untyped_storage()._cdata for t in known}
        self._alive: dict[int, tuple[StorageWeakRef, int]] = {}
        self.live = self.peak = 0

    def held(self) -> int:
        """The bytes alive now (what Python let go of since the last operation taken off)."""
        self._sweep()
        return self.live

    def reset_peak(self) -> None:
        self.peak = self.held()

    def _sweep(self) -> None:
        for key in [k for k, (ref, _) in self._alive.items() if ref.expired()]:
            self.live -= self._alive.pop(key)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._sweep()  # what Python let go of since the last operation
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage._cdata
                if key not in self._known and key not in self._alive:
                    self._alive[key] = (StorageWeakRef(storage), storage.nbytes())
                    self.live += storage.nbytes()
        self.peak = max(self.peak, self.live)
        return out


@dataclass(frozen=True)
class GenerationMemory:
    """Bytes the sampling loop holds for `rows` rows (module doc)."""

    rows: int
    kv_cache: int
    queries: int
    step: int

    @property
    def total(self) -> int:
        return self.kv_cache + self.queries + self.step


def loop_modules(cfg: StyleVARConfig, dtype: torch.dtype) -> tuple[Block, AdaLNHead, nn.Linear]:
    """One block and the head of ``cfg`` on the meta device, in ``dtype``."""
    with META:
        block = Block(cfg).to(dtype).eval()
        head_nm, head = AdaLNHead(cfg.embed_dim, cfg.norm_eps).to(dtype), nn.Linear(cfg.embed_dim, cfg.vocab_size)
    return block, head_nm, head.to(dtype)


@functools.lru_cache(maxsize=256)  # a pure function of its arguments: `max_batch` asks for the same sizes again
@torch.no_grad()
def generation_memory(cfg: StyleVARConfig, batch: int, dtype: torch.dtype = torch.float32, *,
                      guidance: bool = False) -> GenerationMemory:
    """What `generate`'s loop holds for ``batch`` samples of ``cfg`` in ``dtype`` (module doc)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    R, C, L, l = batch * (2 if guidance else 1), cfg.embed_dim, cfg.num_tokens, cfg.patch_nums[-1] ** 2
    modules = loop_modules(cfg, dtype)
    block, head_nm, head = modules
    with META, LiveBytes([t for m in modules for t in (*m.parameters(), *m.buffers())]) as live:
        cache = KVCache(R, cfg.num_heads, L, cfg.head_dim, META, dtype)
        kv_cache = live.held()
        cond_RD, stream_RLC = torch.empty(R, C, dtype=dtype), torch.empty(R, L, C, dtype=dtype)
        before = live.held()
        mod = block.modulation(cond_RD)
        per_block = live.held() - before
        head_mod = head_nm.modulation(cond_RD)
        modulations = (cfg.depth - 1) * per_block + live.held() - before  # every block's, and the head's
        live.reset_peak()
        before = live.held()
        q_RHXc = block.queries(stream_RLC.unsqueeze(1), stream_RLC, mod)
        queries = live.held() - before
        making = live.peak - live.held()
        live.reset_peak()
        before = live.held()
        cache.end = L - l  # the finest scale: every coarser one written
        q_RHxc = q_RHXc.unflatten(2, (2, -1))[:, :, :, L - l:].flatten(2, 3)
        alpha_R1l1 = torch.full((1,), 0.5).expand(R, 1, l, 1)
        x_RlC = block(torch.empty(R, l, C, dtype=dtype), mod, Guide(alpha_R1l1, q_BHXc=q_RHxc), None, cache)
        logits_RlV = head(head_nm(x_RlC, head_mod)).float()
        sample(logits_RlV, [torch.Generator()], DEFAULT_GENERATION.top_k, DEFAULT_GENERATION.top_p)
        step = live.peak - before
    return GenerationMemory(R, cfg.depth * kv_cache, cfg.depth * queries, modulations + max(step, making))


def max_batch(cfg: StyleVARConfig, budget_bytes: int, dtype: torch.dtype = torch.float32, *,
              guidance: bool = False, limit: int = 256) -> int:
    """The most samples whose loop fits in ``budget_bytes``, at most ``limit``; 0 when not even one does."""
    one = generation_memory(cfg, 1, dtype, guidance=guidance).total
    per_sample = generation_memory(cfg, 2, dtype, guidance=guidance).total - one
    if one > budget_bytes:
        return 0
    return min(limit, 1 + (budget_bytes - one) // per_sample)
