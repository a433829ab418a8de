"""The conformance data (tests/data/reference) and seeded stand-in weights in the published layouts.

A key table lists a published checkpoint's state dict, one entry per line in the checkpoint's order:
``name<TAB>(shape)<TAB>dtype``. `seeded_state` turns a table into a state dict of that exact layout, so
the loaders can be tested against the published formats without downloading a checkpoint. For a small
configuration the folder also holds what the reference implementation computed from such seeded
weights (`golden_small/golden.pt`); matching it needs the same tensors bit for bit, so the scheme below
is fixed, not a choice to tune:

* One CPU ``torch.Generator``, seeded with ``seed``, serves the whole table, entry after entry in table
  order. Values are drawn in place into a fresh float32 tensor of the entry's shape (``normal_`` /
  ``uniform_``, the same stream as ``torch.randn`` / ``torch.rand``), then scaled.
* Entries the architecture derives draw nothing: ``lvl_1L`` is the scale index of each of the L tokens,
  (1, L); ``attn_bias_for_masking`` is 0 where the key's scale is at most the query's and -inf
  elsewhere, (1, 1, L, L); ``num_batches_tracked``, ``zero_k_bias*`` and ``ema_vocab_hit_SV`` are zero.
* Every other entry takes the first rule that fits (N = standard normal, U = uniform on [0, 1)):

  ====================================  ==========================================
  ``*.running_var``                     1 + 0.1 U
  ``*.running_mean``                    0.1 N
  ``*.scale_mul_1H11``                  ln 4 + 0.1 N
  ``pos_start``, ``pos_1LC``, ``lvl_embed.*``  0.02 N
  two or more dimensions                N / sqrt(product of all dimensions but the first)
  other ``*.weight`` (norm scales)      1 + 0.1 N
  anything else (biases)                0.02 N
  ====================================  ==========================================

The arithmetic order (draw, multiply, then add) is part of the scheme: it fixes the float32 rounding.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

DATA_DIR = Path(__file__).resolve().parent / "data" / "reference"
ENV_VAR = "STYLEVAR_REFERENCE_DIR"  # optional override: another folder with the same layout
REQUIRED_FILES = (
    "golden_small/config.json", "golden_small/golden.pt", "golden_small/vae_keys.tsv",
    "golden_small/stylevar_keys.tsv", "golden_small/var_keys.tsv",
    "official/vae_ch160v4096z32_keys.tsv", "official/var_d20_keys.tsv", "official/stylevar_d20_keys.tsv",
)
# the entries of a published layout that are buffers in this project's models, not parameters
BUFFER_LEAVES = ("lvl_1L", "attn_bias_for_masking", "num_batches_tracked", "running_mean", "running_var",
                 "ema_vocab_hit_SV", "zero_k_bias", "zero_k_bias_guide", "zero_k_bias_target")
_ZERO_LEAVES = ("num_batches_tracked", "ema_vocab_hit_SV")


@dataclass(frozen=True)
class Entry:
    """One line of a key table."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # as torch prints it, without "torch.": float32, int64

    @property
    def leaf(self) -> str:
        return self.name.rpartition(".")[2]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def reference_dir() -> Path:
    """The conformance data: ``$STYLEVAR_REFERENCE_DIR`` when set, else tests/data/reference.

    Raises FileNotFoundError naming every file that is missing: the data is part of the repository, so a
    missing file is a broken checkout (or a wrong override), never a reason to skip.
    """
    override = os.environ.get(ENV_VAR)
    root = Path(override) if override else DATA_DIR
    missing = [f for f in REQUIRED_FILES if not (root / f).is_file()]
    if missing:
        origin = f"${ENV_VAR}={override}" if override else "the repository's copy"
        raise FileNotFoundError(f"conformance data incomplete in {root} ({origin}): missing {', '.join(missing)}; "
                                f"see tests/data/reference/README.md")
    return root


def read_config(root: Path) -> dict[str, Any]:
    """The small configuration the golden outputs were computed for (reference field names)."""
    return json.loads((root / "golden_small" / "config.json").read_text())


def read_key_table(path: str | os.PathLike) -> list[Entry]:
    entries = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            name, shape, dtype = line.split("\t")
            dims = tuple(int(d) for d in shape.strip().strip("()").split(",") if d.strip())
        except ValueError as e:
            raise ValueError(f"{path}:{number}: expected 'name<TAB>(shape)<TAB>dtype', got {line!r}") from e
        entries.append(Entry(name, dims, dtype))
    return entries


def scale_levels(patch_nums: Sequence[int]) -> torch.Tensor:
    """The scale index of each token, coarse to fine: (L,) int64."""
    return torch.cat([torch.full((pn * pn,), k, dtype=torch.int64) for k, pn in enumerate(patch_nums)])


def _derived(entry: Entry, patch_nums: Sequence[int]) -> torch.Tensor | None:
    if entry.leaf == "lvl_1L":
        return scale_levels(patch_nums).view(1, -1)
    if entry.leaf == "attn_bias_for_masking":
        lvl = scale_levels(patch_nums)
        bias = torch.zeros(len(lvl), len(lvl)).masked_fill_(lvl[None, :] > lvl[:, None], -math.inf)
        return bias.view(1, 1, len(lvl), len(lvl))
    if entry.leaf in _ZERO_LEAVES or entry.leaf.startswith("zero_k_bias"):
        return torch.zeros(entry.shape, dtype=getattr(torch, entry.dtype))
    return None


def _drawn(entry: Entry, gen: torch.Generator) -> torch.Tensor:
    t = torch.empty(entry.shape, dtype=torch.float32)
    if entry.leaf == "running_var":
        return t.uniform_(generator=gen).mul_(0.1).add_(1)
    t.normal_(generator=gen)
    if entry.leaf == "running_mean":
        return t.mul_(0.1)
    if entry.leaf == "scale_mul_1H11":
        return t.mul_(0.1).add_(math.log(4.0))
    if entry.leaf in ("pos_start", "pos_1LC") or entry.name.startswith("lvl_embed."):
        return t.mul_(0.02)
    if len(entry.shape) >= 2:
        return t.div_(math.sqrt(math.prod(entry.shape[1:])))
    if entry.leaf == "weight":
        return t.mul_(0.1).add_(1)
    return t.mul_(0.02)


def seeded_state(table: Sequence[Entry], patch_nums: Sequence[int], seed: int) -> dict[str, torch.Tensor]:
    """A state dict in the table's layout, filled by the scheme in this module's docstring."""
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for entry in table:
        value = _derived(entry, patch_nums)
        if value is None:
            value = _drawn(entry, gen)
        made = str(value.dtype).removeprefix("torch.")
        if made != entry.dtype or tuple(value.shape) != entry.shape:
            raise ValueError(f"{entry.name}: the table says {entry.dtype}{list(entry.shape)}, "
                             f"the scheme makes {made}{list(value.shape)}")
        state[entry.name] = value
    return state


def parameter_count(table: Sequence[Entry]) -> int:
    """Elements of the table's entries that are parameters (buffers excluded), in the table's own layout."""
    return sum(e.numel for e in table if e.leaf not in BUFFER_LEAVES)
