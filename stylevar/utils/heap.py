"""What the process's C heap (glibc) does with memory it frees: kept for the next request instead of handed back.

The policy fixes malloc's mmap threshold at 32 MiB and its trim threshold at ``STYLEVAR_HEAP_KEEP_MB`` (default
1024; 0 leaves glibc's own), trading resident size for fewer page faults; decided once per process.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from collections.abc import Callable, Mapping
from dataclasses import dataclass

HEAP_ENV = "STYLEVAR_HEAP_KEEP_MB"
DEFAULT_KEEP_MB = 1024
MAX_KEEP_MB = 2047  # mallopt takes a C int of bytes
MMAP_THRESHOLD = 32 << 20  # glibc refuses more on 64-bit (half its largest heap)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>


@dataclass(frozen=True)
class HeapChoice:
    """What the process decided: the MiB of freed memory its heap keeps (None: glibc's own thresholds) and why."""

    keep_mb: int | None
    source: str


_decided: HeapChoice | None = None


def keep_mb(environ: Mapping[str, str] | None = None) -> int:
    """``STYLEVAR_HEAP_KEEP_MB`` of ``environ``: whole MiB, 0 to 2047; unset or empty: `DEFAULT_KEEP_MB`."""
    raw = (os.environ if environ is None else environ).get(HEAP_ENV, "").strip()
    if not raw:
        return DEFAULT_KEEP_MB
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_KEEP_MB:
        raise ValueError(f"{HEAP_ENV}={raw!r}: a whole number of MiB from 0 to {MAX_KEEP_MB} "
                         f"(0 leaves the C library's own thresholds)")
    return int(raw)


def glibc_function(name: str) -> Callable[..., int] | None:
    """glibc's function ``name`` (``mallopt``, ``malloc_trim``), or None where the C library is another (musl,
    macOS, Windows) or lacks it."""
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return getattr(libc, name, None)


def apply_heap_policy(environ: Mapping[str, str] | None = None, *, keep: int | None = None) -> HeapChoice:
    """Set the heap's thresholds once per process; returns the decision (``keep``: MiB, else `keep_mb`)."""
    global _decided
    if _decided is not None:
        return _decided
    env = os.environ if environ is None else environ
    if keep is None:
        keep, source = keep_mb(env), HEAP_ENV if env.get(HEAP_ENV, "").strip() else "default"
    elif 0 <= keep <= MAX_KEEP_MB:
        source = "setting"
    else:
        raise ValueError(f"keep {keep} MiB: from 0 to {MAX_KEEP_MB} (0 leaves the C library's own thresholds)")
    mallopt = glibc_function("mallopt") if keep else None
    if not keep:
        choice = HeapChoice(None, f"{HEAP_ENV}=0")
    elif mallopt is None:
        choice = HeapChoice(None, "not glibc: nothing set")
    elif mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, keep << 20) == 1:
        choice = HeapChoice(keep, source)
    else:
        choice = HeapChoice(None, "mallopt refused the thresholds")
    _decided = choice
    return choice
