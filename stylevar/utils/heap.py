"""What the process's C heap does with memory it frees: kept for the next request instead of handed back to the
operating system, and the one setting that says how much.

glibc's malloc serves a block above its mmap threshold (128 KiB at start, raised by itself up to 32 MiB as such
blocks are freed) with a fresh mapping that it unmaps when the block is freed, and hands back free memory at the
top of its heap beyond its trim threshold (twice the mmap threshold). A stylization lives on short-lived buffers of
a few MB each (Pillow's images, torch's tensors, numpy's arrays), so every request faulted in, page by page, the
memory the one before had just handed back: about 4,400 page faults per 1024 px request on the demo model, each a
kernel entry and a zeroed page (about 2 us each on the development machine, a virtual one: ~10 ms of a 0.2 s
request, before the caches they cool). The policy fixes the mmap threshold at 32 MiB (glibc's largest on 64-bit)
and the trim threshold at ``STYLEVAR_HEAP_KEEP_MB`` (default 1024): freed blocks are reused, and the same request
faults 0.2 times on average (benchmarks/README.md, "Ours beside the pretrained peer").

The cost: the process keeps up to that much freed memory mapped, so its resident size stays near its peak after a
large request instead of shrinking; the peak itself is unchanged. ``STYLEVAR_HEAP_KEEP_MB=0`` leaves glibc's own
thresholds. Only where the C library is glibc (Linux); elsewhere nothing is set. Like the threads
(`stylevar.utils.threads`), a process decides once, at its first model load (`StylePipeline.from_pretrained`, which
the service and the command line go through).
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
    """``STYLEVAR_HEAP_KEEP_MB`` from ``environ`` (None: this process's): a whole number of MiB, 0 to 2047; unset
    or empty: `DEFAULT_KEEP_MB`."""
    raw = (os.environ if environ is None else environ).get(HEAP_ENV, "").strip()
    if not raw:
        return DEFAULT_KEEP_MB
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_KEEP_MB:
        raise ValueError(f"{HEAP_ENV}={raw!r}: a whole number of MiB from 0 to {MAX_KEEP_MB} "
                         f"(0 leaves the C library's own thresholds)")
    return int(raw)


def glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or None where the C library is another (musl, macOS, Windows)."""
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return getattr(libc, "mallopt", None)


def apply_heap_policy(environ: Mapping[str, str] | None = None, *, keep: int | None = None) -> HeapChoice:
    """Set the heap's thresholds by the module doc, once per process; returns what was decided (the first
    decision on every later call). ``keep``: the MiB to keep (the service's setting), else `keep_mb` of
    ``environ`` (None: this process's)."""
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
    mallopt = glibc_mallopt() if keep else None
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
