"""An LRU cache of what each reference image contributes to generation, bounded in bytes.

Entries (a style image's embedding and token stream, a content image's `StyleVAR.content_parts`) are keyed by a
hash of the input tensor's bytes, the part's kind and options, and a scope (the service's: the API key that sent the
row, so that no client learns from a faster answer what another sent). Within a batch each distinct image is
computed once. `stats()` and the optional observer give hits, misses and size.
"""
from __future__ import annotations

import hashlib
import itertools
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

Part = tuple[torch.Tensor | None, ...]  # one image's tensors (no batch dimension), None where a field is unset


class CacheObserver(Protocol):
    def cache_lookup(self, kind: str, hits: int, misses: int) -> None: ...

    def cache_size(self, entries: int, nbytes: int) -> None: ...


@dataclass
class CacheStats:
    hits: dict[str, int]
    misses: dict[str, int]
    entries: int
    bytes: int
    max_bytes: int


DIGEST_MODULUS = 2**24 - 3  # a prime: coefficients, products (x 255) and chunk sums stay exact in float64
DIGEST_HASHES = 5  # independent residues: two different inputs share all five with probability p^-5, about 2^-120
DIGEST_CHUNK = 1 << 20  # bytes per exact dot product: 2^20 x 255 x p < 2^53


def _on_host(images: torch.Tensor) -> bool:
    return images.device.type == "cpu"


class ImageDigest:
    """Digests of a batch of model inputs (each row's shape, dtype and bytes), under a key of its own.

    On the host: blake2b of each row's bytes. On a device the rows are hashed there (DIGEST_HASHES residues
    sum_i b_i * a_ki mod p, a multilinear universal hash keyed by the secret key: collision probability p^-5),
    and only those B x 5 numbers come to the host."""

    def __init__(self, key: int | None = None):
        self.key = secrets.randbits(62) if key is None else key
        self._coefficients: tuple[tuple, torch.Tensor] | None = None  # the last table, by (device, C, L)

    def __call__(self, images_B: torch.Tensor) -> list[str]:
        images_B = images_B.detach()
        if _on_host(images_B):
            return [_blake(img.shape, img.dtype, "bytes", img.contiguous().view(torch.uint8).numpy())
                    for img in images_B]
        return [_blake(images_B.shape[1:], images_B.dtype, "keyed", repr(r).encode())
                for r in self.residues(images_B).tolist()]

    def residues(self, images_B: torch.Tensor) -> torch.Tensor:
        """(B, DIGEST_HASHES) residues of each row's bytes on the rows' device (exact in float64), a row at a time."""
        B = images_B.shape[0]
        bytes_BN = images_B.contiguous().view(B, -1).view(torch.uint8)
        n = bytes_BN.shape[1]
        L = max(1, min(n, DIGEST_CHUNK))
        C = -(-n // L)
        coeff_CLK = self.coefficients(images_B.device, C, L)
        out_BK = []
        for row_N in bytes_BN:
            w_C1L = F.pad(row_N.double(), (0, C * L - n)).view(C, 1, L)
            dots_CK = torch.bmm(w_C1L, coeff_CLK).squeeze(1).fmod_(DIGEST_MODULUS)
            out_BK.append(dots_CK.sum(0).fmod_(DIGEST_MODULUS))
        return torch.stack(out_BK).long()

    def coefficients(self, device: torch.device, C: int, L: int) -> torch.Tensor:
        """(C, L, DIGEST_HASHES) coefficients drawn from the key: the same table for the same device and size, so the
        last one is kept (the model's inputs have one size: one table, drawn once, instead of two per batch)."""
        if self._coefficients is None or self._coefficients[0] != (device, C, L):
            gen = torch.Generator(device=device).manual_seed(self.key)
            table = torch.randint(0, DIGEST_MODULUS, (C, L, DIGEST_HASHES), generator=gen, dtype=torch.float64,
                                  device=device)
            self._coefficients = ((device, C, L), table)
        return self._coefficients[1]


def _blake(shape: torch.Size, dtype: torch.dtype, kind: str, data) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(repr((tuple(shape), str(dtype), kind)).encode())
    h.update(data)
    return h.hexdigest()


def _nbytes(part: Part) -> int:
    return sum(t.numel() * t.element_size() for t in part if t is not None)


class ConditionCache:
    """Thread-safe LRU map from (scope, kind, options, image digest) to an image's part; `max_bytes` 0 disables it."""

    def __init__(self, max_bytes: int, observer: CacheObserver | None = None):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.observer = observer
        self._digests = ImageDigest()
        self._entries: OrderedDict[tuple, Part] = OrderedDict()
        self._bytes = 0
        self._hits: dict[str, int] = {}
        self._misses: dict[str, int] = {}
        self._lock = threading.Lock()
        self._model_state: int | None = None

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(dict(self._hits), dict(self._misses), len(self._entries), self._bytes, self.max_bytes)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
        self._report_size()

    def follow(self, model) -> None:
        """Empty the cache when ``model`` is not as at the last call (moved, cast, prepared, trained: its tensors'
        storage or in-place versions differ, or its autocast), so that no entry outlives the weights that made it."""
        if not self.enabled:
            return  # nothing kept: no walk over the model's tensors
        tensors = itertools.chain(model.parameters(), model.buffers())
        state = hash((model.autocast_dtype, *((id(t), t.data_ptr(), 0 if t.is_inference() else t._version)
                                               for t in tensors)))
        if self._model_state is not None and state != self._model_state:
            self.clear()
        self._model_state = state

    def _get(self, key: tuple) -> Part | None:
        with self._lock:
            part = self._entries.get(key)
            if part is not None:
                self._entries.move_to_end(key)
            return part

    def _put(self, key: tuple, part: Part) -> None:
        size = _nbytes(part)
        if size > self.max_bytes:
            return  # larger than the whole cache: never stored
        part = tuple(None if t is None else t.clone() for t in part)  # a row of the batch holds the batch's storage
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= _nbytes(old)
            self._entries[key] = part
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= _nbytes(evicted)

    def _count(self, kind: str, hits: int, misses: int) -> None:
        with self._lock:
            self._hits[kind] = self._hits.get(kind, 0) + hits
            self._misses[kind] = self._misses.get(kind, 0) + misses
        if self.observer is not None:
            self.observer.cache_lookup(kind, hits, misses)

    def _report_size(self) -> None:
        if self.observer is not None:
            s = self.stats()
            self.observer.cache_size(s.entries, s.bytes)

    def rows(self, kind: str, options: tuple, images_B3HW: torch.Tensor,
             compute: Callable[[torch.Tensor], Sequence[torch.Tensor | None]],
             scopes: Sequence[str] | None = None) -> list[torch.Tensor | None]:
        """The batch's tensors (B, ...) of ``compute(images)`` (a tuple of (N, ...) tensors or None), each distinct
        image computed at most once, looked up first in its row's scope (`scopes`, one a row; None: one scope)."""
        digests = self._digests(images_B3HW)
        keys = [(scope, kind, options, d) for scope, d in zip(scopes or [""] * len(digests), digests)]
        unique = dict.fromkeys(keys)
        parts: dict[tuple, Part] = {k: p for k in unique if self.enabled and (p := self._get(k)) is not None}
        missing = [key for key in unique if key not in parts]
        if missing:
            to_compute = list(dict.fromkeys(key[3] for key in missing))  # an image sent in two scopes: once
            fresh = compute(images_B3HW[[digests.index(d) for d in to_compute]])
            for key in missing:
                i = to_compute.index(key[3])
                parts[key] = tuple(None if t is None else t[i] for t in fresh)
                if self.enabled:
                    self._put(key, parts[key])
        self._count(kind, hits=len(parts) - len(missing), misses=len(missing))
        if missing and self.enabled:
            self._report_size()
        n_fields = len(parts[keys[0]])
        return [None if parts[keys[0]][f] is None else torch.stack([parts[k][f] for k in keys])
                for f in range(n_fields)]


def cached_condition(model, cache: ConditionCache, content_B3HW: torch.Tensor, style, unstyled: bool = False,
                     scopes: Sequence[str] | None = None):
    """`model.condition(content, style, unstyled=...)`, each image's part from ``cache`` (its row's `scopes` entry)."""
    n_styles = 1 if isinstance(style, torch.Tensor) else len(style.styles)
    style_scopes = None if scopes is None else list(scopes) * n_styles  # the blend's styles, style-major

    def content_parts(x: torch.Tensor, unstyled: bool):
        return cache.rows("content", (unstyled,), x, lambda y: model.content_parts(y, unstyled), scopes)

    return model.condition(content_B3HW, style, unstyled=unstyled, content_parts=content_parts,
                           style_parts=lambda x: cache.rows("style", (), x, model.style_parts, style_scopes))
