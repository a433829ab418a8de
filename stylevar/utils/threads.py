"""How many CPU threads torch runs, one policy for the service, the command line and the library.

The policy (`DEFAULT_RULE`, "spare-one"): one thread fewer than the CPUs this process may use (`cpu_budget`), at
most torch's own choice; an explicit count or the OpenMP/MKL variables win over it. A process decides once, at
its first model load. No torch at import.
"""
from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

THREADS_ENV = "STYLEVAR_THREADS"
TORCH_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # torch reads these when it starts
WAIT_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")  # OpenMP (libgomp) reads these when torch is imported
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
SYS_CPU = Path("/sys/devices/system/cpu")

# the policy's rules: the CPUs the process may use -> torch's intra-op threads
RULES: dict[str, Callable[[int], int]] = {
    "available": lambda cpus: cpus,
    "spare-one": lambda cpus: max(1, cpus - 1),
    "one": lambda cpus: 1,
}
DEFAULT_RULE = "spare-one"
DEFAULT_PASSIVE = True  # the entry points set OMP_WAIT_POLICY=PASSIVE (prepare_environment)
KEEP = "torch"  # threads="torch": torch's count left as it is
THREADS_HELP = (f"torch's CPU threads: a count, '{KEEP}' (torch's own choice) or 'auto' (the policy: one fewer "
                f"than the CPUs this process may use, at least 1; docs/serving.md#threads)")


@dataclass(frozen=True)
class CpuBudget:
    """The CPUs of the affinity mask and the cgroup's quota in CPUs (None: no quota)."""

    affinity: int
    quota: float | None = None

    @property
    def cpus(self) -> int:
        """What the process may use at once: the affinity's CPUs, at most the quota rounded up; at least 1."""
        limit = self.affinity if self.quota is None else min(self.affinity, math.ceil(self.quota))
        return max(1, limit)

    def __str__(self) -> str:
        quota = "no cgroup quota" if self.quota is None else f"cgroup quota {self.quota:g}"
        return f"{self.cpus} CPU{'s' if self.cpus != 1 else ''} (affinity {self.affinity}, {quota})"


def affinity_mask() -> list[int]:
    """The logical CPUs this process may run on (its affinity mask; every CPU where there is none)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def affinity_cpus() -> int:
    """How many CPUs this process may run on (`affinity_mask`), at least 1."""
    return max(1, len(affinity_mask()))


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def parse_cpu_max(text: str | None) -> float | None:
    """cgroup v2 ``cpu.max`` ("QUOTA PERIOD" in microseconds; QUOTA "max": no quota) as CPUs."""
    parts = (text or "").split()
    if not parts or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1]) if len(parts) > 1 else 100_000
    except ValueError:
        return None  # unreadable: as if there were none
    return quota / period if quota > 0 and period > 0 else None


def parse_cfs(quota_text: str | None, period_text: str | None) -> float | None:
    """cgroup v1 ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us`` as CPUs (a quota of -1: none)."""
    try:
        quota, period = int((quota_text or "").strip()), int((period_text or "").strip())
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _folders(mount: Path, path: str) -> list[Path]:
    """The cgroup's folder under ``mount`` and each parent up to it; ``mount`` alone where it is not there."""
    folder = mount / path.strip("/")
    if not folder.is_dir():
        return [mount]
    out = [folder]
    while folder != mount and folder != folder.parent:
        folder = folder.parent
        out.append(folder)
    return out


def cgroup_quota(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The least CPU quota, in CPUs, of this process's cgroup and its parents (v2 and v1); None: no quota."""
    text = _read(proc_cgroup)
    quotas: list[float | None] = []
    for line in (text or "").splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # cgroup v2: the unified hierarchy
            quotas += [parse_cpu_max(_read(d / "cpu.max")) for d in _folders(root, path)]
        elif "cpu" in controllers.split(","):  # cgroup v1: the cpu controller's own hierarchy
            mount = next((m for m in (root / "cpu", root / "cpu,cpuacct", root / "cpuacct,cpu") if m.is_dir()), None)
            if mount is not None:
                quotas += [parse_cfs(_read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us"))
                           for d in _folders(mount, path)]
    found = [q for q in quotas if q is not None]
    return min(found) if found else None


def cpu_budget(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> CpuBudget:
    """The CPUs this process may use (module doc)."""
    return CpuBudget(affinity_cpus(), cgroup_quota(root, proc_cgroup))


def physical_cores(cpus: Iterable[int], sys_cpu: Path = SYS_CPU) -> int | None:
    """How many physical cores ``cpus`` (logical CPU numbers) sit on; None when the topology cannot be read."""
    cores = set()
    for cpu in cpus:
        siblings = _read(sys_cpu / f"cpu{cpu}" / "topology" / "thread_siblings_list")
        if siblings is None:
            return None
        cores.add(siblings.strip())
    return len(cores) or None


def torch_own_counts() -> set[int]:
    """The counts torch picks by itself on this machine (which one depends on torch's build)."""
    mask = affinity_mask()
    logical = os.cpu_count() or len(mask)
    counts = {logical, len(mask), physical_cores(range(logical)), physical_cores(mask)}
    return {c for c in counts if c}


def parse_threads(value: int | str | None) -> int | str | None:
    """A thread count as the surfaces take it: None, "", "auto" or 0 -> None (the policy); "torch" -> "torch";
    a positive integer (or its digits) -> that count. Anything else is a ValueError saying what is taken."""
    text = value.strip().lower() if isinstance(value, str) else value
    if isinstance(text, str) and text.isascii() and text.isdigit():
        text = int(text)
    if text is None or text in ("", "auto") or (type(text) is int and text == 0):
        return None
    if text == KEEP:
        return KEEP
    if type(text) is int and text > 0:  # not a bool, not a float
        return text
    raise ValueError(f"threads must be a positive integer, 'auto' or '{KEEP}', got {value!r}")


@dataclass(frozen=True)
class ThreadChoice:
    """What decided torch's threads: the count set (None: torch's count left as it is) and why."""

    threads: int | None
    source: str
    policy: bool = False  # the policy's count (which torch.set_num_threads made earlier overrules)

    def __str__(self) -> str:
        count = "torch's own count" if self.threads is None else f"{self.threads} thread{'s' * (self.threads != 1)}"
        return f"{count} ({self.source})"


def choose_threads(threads: int | str | None = None, environ: Mapping[str, str] | None = None,
                   budget: CpuBudget | None = None) -> ThreadChoice:
    """`apply_threads`' order without its step that needs torch (an earlier ``torch.set_num_threads``)."""
    environ = os.environ if environ is None else environ
    def explicit(value: int | str, source: str) -> ThreadChoice:
        return ThreadChoice(None if value == KEEP else int(value), source)

    value = parse_threads(threads)
    if value is not None:
        return explicit(value, f"threads={value!r}")
    if environ.get(THREADS_ENV, "").strip():
        try:
            value = parse_threads(environ[THREADS_ENV])
        except ValueError as e:
            raise ValueError(f"{THREADS_ENV}: {e}") from None
        if value is not None:
            return explicit(value, f"{THREADS_ENV}={environ[THREADS_ENV].strip()}")
    for name in TORCH_ENV:
        if environ.get(name, "").strip():
            return ThreadChoice(None, f"{name}={environ[name].strip()}, read by torch")
    budget = cpu_budget() if budget is None else budget
    return ThreadChoice(RULES[DEFAULT_RULE](budget.cpus), f"policy {DEFAULT_RULE}: {budget}", policy=True)


_decided: ThreadChoice | None = None  # this process's decision (apply_threads), once made


def decision() -> ThreadChoice | None:
    """What decided this process's threads (None: nothing yet)."""
    return _decided


def apply_threads(threads: int | str | None = None, environ: Mapping[str, str] | None = None) -> ThreadChoice:
    """Set torch's intra-op threads and return what decided: an explicit count (``threads``, ``STYLEVAR_THREADS``),
    ``OMP_NUM_THREADS``/``MKL_NUM_THREADS``, an earlier ``torch.set_num_threads``, else the policy."""
    global _decided
    value = parse_threads(threads)
    if value is None and _decided is not None:
        return _decided
    import torch
    choice = choose_threads(value, environ)
    current = torch.get_num_threads()
    if choice.policy:
        if current not in torch_own_counts():
            choice = ThreadChoice(None, f"torch.set_num_threads({current}) before the first load")
        elif choice.threads is not None and choice.threads > current:  # never more than torch's own choice
            choice = ThreadChoice(current, f"{choice.source}, at most torch's own {current}", policy=True)
    if choice.threads is not None and choice.threads != current:
        torch.set_num_threads(choice.threads)
    _decided = choice
    return choice


def prepare_environment(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Before torch is imported: ``OMP_WAIT_POLICY=PASSIVE`` unless a `WAIT_ENV` setting is there; what it set."""
    if environ is None:
        if "torch" in sys.modules:
            return {}
        environ = os.environ
    if not DEFAULT_PASSIVE or any(environ.get(name, "").strip() for name in WAIT_ENV):
        return {}
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return {"OMP_WAIT_POLICY": "PASSIVE"}
