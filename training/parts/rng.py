"""Seeding, generators derived from integer keys, and the capture and restore of every RNG state.

Randomness that must agree across ranks or survive a resume is derived from ``(seed, ...)``.
"""
from __future__ import annotations

import random
from typing import Any, Mapping

import numpy as np
import torch

from training.parts.distributed import DistEnv, all_gather_object


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def derived_generator(*keys: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch.Generator seeded from a tuple of integers, e.g. (seed, step, stream)."""
    state = np.random.SeedSequence([int(k) % 2**64 for k in keys]).generate_state(1, dtype=np.uint64)
    return torch.Generator(device=device).manual_seed(int(state[0]) & 0x7FFFFFFFFFFFFFFF)


def process_seed(seed: int, rank: int) -> int:
    """A per-process seed for the global RNGs after model construction (distinct for each (seed, rank))."""
    return derived_generator(seed, rank, 0x5EED).initial_seed() % (2**63)


def capture_rng_state(generators: Mapping[str, torch.Generator] | None = None,
                      device: torch.device | None = None) -> dict[str, Any]:
    """Every RNG state of this process (weights_only-loadable); on CUDA only ``device``'s."""
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_internal, py_gauss = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": py_version, "internal": list(py_internal), "gauss": py_gauss},
        "numpy": {
            "name": np_name,
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
        "torch": torch.get_rng_state(),
        "cuda": [torch.cuda.get_rng_state(device)] if device is not None and device.type == "cuda" else [],
        "generators": {name: g.get_state() for name, g in (generators or {}).items()},
    }
    return state


def restore_rng_state(state: Mapping[str, Any], generators: Mapping[str, torch.Generator] | None = None,
                      device: torch.device | None = None) -> None:
    """Restore a :func:`capture_rng_state`, its CUDA state onto ``device``."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    npst = state["numpy"]
    np.random.set_state(
        (npst["name"], npst["keys"].numpy().astype(np.uint32), npst["pos"], npst["has_gauss"], npst["gauss"])
    )
    torch.set_rng_state(state["torch"])
    _restore_cuda(state["cuda"], device)
    saved = state.get("generators", {})
    for name, g in (generators or {}).items():
        if name not in saved:
            raise KeyError(f"checkpoint has no state for generator {name!r}")
        g.set_state(saved[name])


def _restore_cuda(states: list[torch.Tensor], device: torch.device | None) -> None:
    """The saved CUDA state of ``device``'s index onto ``device``; nothing on the CPU or where the run had no GPU."""
    if not states or device is None or device.type != "cuda":
        return
    index = 0 if len(states) == 1 else (device.index or 0)
    if index < len(states):
        torch.cuda.set_rng_state(states[index], device)


def gather_rng_states(env: DistEnv, generators: Mapping[str, torch.Generator] | None = None) -> list[dict]:
    """RNG states of all ranks (a list indexed by rank)."""
    return all_gather_object(capture_rng_state(generators, env.device), env)
