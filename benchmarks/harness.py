"""What the benchmarks share: the process set up as the service's, calls timed taking turns (so a shared machine's
changing load weighs on each alike), the peak of a reading sampled beside a block (a process's resident memory, GPU
memory), and the report (JSON where asked, a table on stdout). No torch here: a benchmark's --help stays fast."""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from stylevar.cli.command import Parser  # no torch
from stylevar.utils.heap import apply_heap_policy  # no torch
from stylevar.utils.helptext import RawDescriptionHelpFormatter
from stylevar.utils.threads import apply_threads  # no torch


def serving_process(threads: int) -> None:
    """This process set up as the service's and the command line's: torch's ``threads``, the heap's policy (freed
    memory kept)."""
    apply_threads(threads)
    apply_heap_policy()


def take_turns(fns: dict[str, Callable[[], object]], repeats: int, warmup: int,
               clocks: Sequence[Callable[[], float]] = (time.perf_counter,)) -> dict[str, list[float]]:
    """Median seconds per clock of each function's calls, taking turns after ``warmup`` rounds."""
    times: dict[str, list[list[float]]] = {name: [[] for _ in clocks] for name in fns}
    for r in range(warmup + repeats):
        for name, fn in fns.items():
            t0 = [clock() for clock in clocks]
            fn()
            if r >= warmup:
                for per_clock, clock, start in zip(times[name], clocks, t0):
                    per_clock.append(clock() - start)
    return {name: [statistics.median(t) for t in per_clock] for name, per_clock in times.items()}


def time_turns(fns: dict[str, dict[str, Callable[[], object]]], batch: int, repeats: int, warmup: int,
               stages: Sequence[str]) -> dict[str, dict[str, float]]:
    """Median ms per image of each implementation's calls of each stage, taking turns call by call."""
    out: dict[str, dict[str, float]] = {name: {} for name in fns}
    for stage in stages:
        medians = take_turns({name: f[stage] for name, f in fns.items() if stage in f}, repeats, warmup)
        for name, (seconds,) in medians.items():
            out[name][stage] = 1000 * seconds / batch
    return out


def command_parser(module: str, description: str) -> Parser:
    """``python -m module``'s options, the description's line breaks kept (an unknown option gets the nearest)."""
    return Parser(prog=f"python -m {module}", description=description, formatter_class=RawDescriptionHelpFormatter)


def timing_arguments(p: argparse.ArgumentParser, repeats: int, warmup: int) -> None:
    """The options the CPU timing benchmarks share: batch sizes, repeats, warm-up calls, threads."""
    p.add_argument("--batch-sizes", default="1,4", help="images per call, comma-separated: one measurement each")
    p.add_argument("--repeats", type=int, default=repeats, help="timed calls per stage (their median is reported)")
    p.add_argument("--warmup", type=int, default=warmup, help="untimed rounds before the timed ones")
    p.add_argument("--threads", type=int, default=2, help="torch's CPU threads")


class PeakSampler:
    """While entered, ``read()`` every ``every_s`` seconds on a thread; `peak` is the largest reading."""

    def __init__(self, read: Callable[[], float | None], every_s: float, peak: float | None = None):
        self.read, self.every_s, self.peak = read, every_s, peak
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            value = self.read()
            if value is not None:
                self.peak = value if self.peak is None else max(self.peak, value)
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def proc_bytes(pid: int, field: str = "VmRSS") -> int:
    """A memory field of /proc/PID/status in bytes (VmRSS: resident now; VmHWM: the process's peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for process {pid}")


def proc_mb(pid: int, field: str = "VmRSS") -> float:
    return proc_bytes(pid, field) / 2**20


async def sample_rss_mb(pid: int, until: float, every_s: float, into: list[float]) -> None:
    """Append the process's resident MB to ``into`` every ``every_s`` seconds until monotonic time ``until``."""
    while time.monotonic() < until:
        into.append(proc_mb(pid))
        await asyncio.sleep(every_s)


def emit(result: dict, json_path: Path | None, table: str) -> int:
    """Write ``result`` to ``json_path`` (when given), print ``table``; the benchmark's exit status (0)."""
    if json_path:
        json_path.write_text(json.dumps(result, indent=1))
    print(table)
    return 0
