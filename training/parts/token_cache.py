"""Token cache: the frozen tokenizer's token maps of every training triplet, computed once and read back in later
epochs and runs on the same data (``training.sft --token-cache``; data without augmentation only).

In ``.token-cache/<key>/`` beside the data (the key hashes the tokenizer, image size, split and manifests): chunks
of `CHUNK` items' maps with their images' fingerprint, written atomically; a changed chunk is built again.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from torch.utils.data import DataLoader, Subset

from stylevar.models.pretrained import save_safetensors
from stylevar.models.tokenizer import MultiScaleVQVAE
from training.parts.data import TripletDataset, collate_triplets
from training.parts.distributed import DistEnv
from training.parts.streams import LoaderPolicy
from training.parts.token_inputs import encode_triplets

CHUNK = 256  # items per file
FOLDER = ".token-cache"
FORMAT = "stylevar-token-cache-1"


class TokenCacheError(ValueError):
    """The data or the run cannot use a token cache (the message says why)."""


def tokenizer_checksum(tokenizer: MultiScaleVQVAE) -> str:
    """sha256 of the tokenizer's config and every tensor of its state dict, whatever the memory layout."""
    h = hashlib.sha256(json.dumps(tokenizer.cfg.to_dict(), sort_keys=True).encode())
    for name, t in sorted(tokenizer.state_dict().items()):
        t = t.detach().cpu().contiguous().view(-1)
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def cache_folder(dataset: TripletDataset, tokenizer_sha: str) -> Path:
    """Where this data's maps from this tokenizer live (module doc)."""
    h = hashlib.sha256(f"{FORMAT}|{tokenizer_sha}|{dataset.transform.image_size}|{dataset.split}".encode())
    for m in dataset.manifests:
        h.update(Path(m).read_bytes())
    return Path(dataset.manifests[0]).resolve().parent / FOLDER / h.hexdigest()[:16]


def chunk_fingerprint(dataset: TripletDataset, chunk: int) -> str:
    """sha256 of (path, size, mtime) of every image file of the chunk's items (a missing file counts too)."""
    h = hashlib.sha256()
    for entry in dataset.entries[chunk * CHUNK:(chunk + 1) * CHUNK]:
        for role, path in sorted(entry.paths.items()):
            try:
                st = os.stat(path)
                h.update(f"{role}|{path}|{st.st_size}|{st.st_mtime_ns}\n".encode())
            except OSError:
                h.update(f"{role}|{path}|missing\n".encode())
    return h.hexdigest()


@dataclass
class TokenCache:
    """The token maps of a dataset's items, ``tokens_N3L`` (item i: target, style, content)."""

    folder: Path
    tokens_N3L: torch.Tensor
    built: int = 0  # chunks this process encoded (0: all read back)
    seconds: float = 0.0  # time this process spent building

    def lookup(self, index_B: torch.Tensor) -> torch.Tensor:
        """The maps of items ``index_B``: (B, 3, L), as stored (int16 / int32)."""
        return self.tokens_N3L[index_B.long().cpu()]

    def describe(self) -> str:
        n = self.tokens_N3L.shape[0]
        how = f"{self.built} chunks encoded in {self.seconds:.1f} s" if self.built else "read back"
        return f"token cache: {n} triplets, {how} ({self.folder})"


def _chunk_path(folder: Path, chunk: int) -> Path:
    return folder / f"chunk-{chunk:06d}.safetensors"


def _read_chunk(path: Path, fingerprint: str, count: int) -> torch.Tensor | None:
    """The chunk's maps, or None when it is missing, unreadable or made from other files."""
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT or meta.get("fingerprint") != fingerprint:
                return None
            t = f.get_tensor("tokens_n3L")
    except Exception:  # noqa: BLE001 (safetensors' own error too): a torn or foreign file is built again
        return None
    return t if t.shape[0] == count else None


def _encode_chunk(dataset: TripletDataset, tokenizer: MultiScaleVQVAE, chunk: int, batch_size: int,
                  num_workers: int, dtype: torch.dtype) -> torch.Tensor:
    device = next(tokenizer.parameters()).device
    items = range(chunk * CHUNK, min((chunk + 1) * CHUNK, len(dataset)))
    loader = DataLoader(Subset(dataset, items), batch_size=batch_size, collate_fn=collate_triplets,
                        **LoaderPolicy(num_workers).options(persistent=False))
    parts = []
    for batch in loader:
        t, s, c = (batch[k].to(device) for k in ("target", "style", "content"))
        parts.append(encode_triplets(tokenizer, t, s, c)[1].to(dtype).cpu())
    return torch.cat(parts)


def why_not_by_default(dataset, augment: bool, samples: int) -> str | None:
    """Why training.sft skips the cache by default for ``dataset`` (None: it does); ``samples``: steps x batch."""
    if augment:
        return "augmented images, and their tokens, differ every epoch"
    if not isinstance(dataset, TripletDataset):
        return "the data is not a manifest"
    if samples <= len(dataset):
        return f"the run reads {samples} samples of {len(dataset)} triplets, each at most once"
    parent = Path(dataset.manifests[0]).resolve().parent
    if not os.access(parent / FOLDER if (parent / FOLDER).is_dir() else parent, os.W_OK):
        return f"{parent} is not writable"
    return None


def open_token_cache(dataset: TripletDataset, tokenizer: MultiScaleVQVAE, env: DistEnv, *, batch_size: int = 32,
                     num_workers: int = 0, on_chunk: Callable[[int, int], None] | None = None) -> TokenCache:
    """The cache of ``dataset``, this rank's missing or stale chunks built first (all ranks call this)."""
    if not isinstance(dataset, TripletDataset):
        raise TokenCacheError("the token cache needs manifest data (a TripletDataset), not shards")
    aug = dataset.transform.augment
    if aug is not None and aug.enabled:
        raise TokenCacheError("the token cache needs --no-augment: augmented images, and their tokens, "
                              "differ every epoch")
    folder = cache_folder(dataset, tokenizer_checksum(tokenizer))
    dtype = torch.int16 if tokenizer.cfg.vocab_size <= 32767 else torch.int32
    chunks = math.ceil(len(dataset) / CHUNK)
    count = lambda c: min(CHUNK, len(dataset) - c * CHUNK)  # noqa: E731
    built, t0 = 0, time.perf_counter()
    mine: dict[int, torch.Tensor] = {}  # this rank's chunks, as read or built (not read again below)
    for c in range(env.rank, chunks, env.world_size):
        fingerprint = chunk_fingerprint(dataset, c)
        tokens = _read_chunk(_chunk_path(folder, c), fingerprint, count(c))
        if tokens is None:
            tokens = _encode_chunk(dataset, tokenizer, c, batch_size, num_workers, dtype)
            folder.mkdir(parents=True, exist_ok=True)
            save_safetensors({"tokens_n3L": tokens}, _chunk_path(folder, c),
                             metadata={"format": FORMAT, "fingerprint": fingerprint}, what="token cache chunk")
            built += 1
            if on_chunk is not None:
                on_chunk(c, chunks)
        mine[c] = tokens
    seconds = time.perf_counter() - t0
    env.barrier()
    parts = []
    for c in range(chunks):
        t = mine[c] if c in mine else _read_chunk(_chunk_path(folder, c), chunk_fingerprint(dataset, c), count(c))
        if t is None:
            raise TokenCacheError(f"token cache chunk {_chunk_path(folder, c)} is missing or stale after the build")
        parts.append(t)
    return TokenCache(folder, torch.cat(parts), built, seconds)
