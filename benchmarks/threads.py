"""Torch's CPU threads on an idle and a busy machine: seconds per image of the demo pipeline under each thread policy
(`stylevar.utils.threads`), alone and beside another process's busy loop.

    python -m benchmarks.threads [--policies torch,available,available+passive,spare-one+passive,one]
        [--loads idle,busy] [--rounds 8] [--per-turn 3] [--warmup 2] [--size 512] [--pictures new] [--out FILE]

Each candidate runs in a worker subprocess of its own (its thread environment set before it imports torch); the
workers take turns, per load and size, in an order that rotates every round. `benchmarks.versus_peer` uses the same."""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from benchmarks.harness import command_parser, emit
from stylevar.utils.threads import (KEEP, RULES, THREADS_ENV, TORCH_ENV, WAIT_ENV, CpuBudget, affinity_mask,
                                    cpu_budget, parse_threads)

REPO = Path(__file__).resolve().parents[1]
CLEARED = (*TORCH_ENV, *WAIT_ENV, THREADS_ENV)  # this shell's thread settings, left out of every worker's environment
CONTENT, STYLE = "content_mountains.png", "style_brush.png"  # stylevar/assets/examples
BUSY_LOOP = "while True: pass"
# what a worker runs: the library's pipeline, the same prepared as the service runs it, or the peer (onnxruntime)
METHODS = ("library", "served", "peer")
PICTURES = ("new", "repeated")  # what an image may reuse from the ones before it: --pictures' help


@dataclass(frozen=True)
class Candidate:
    """One candidate: its name, thread count (a number or "torch"), OMP_WAIT_POLICY=PASSIVE or not, method."""

    name: str
    threads: int | str
    passive: bool
    method: str = "library"

    def environment(self, base: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in base.items() if k not in CLEARED}
        return {**env, "OMP_WAIT_POLICY": "PASSIVE"} if self.passive else env


def candidate(name: str, budget: CpuBudget) -> Candidate:
    """``[METHOD:]RULE[+passive]`` over ``budget``; the peer takes a count or a rule, without +passive."""
    method, colon, policy = name.strip().rpartition(":")
    method = method if colon else "library"
    if method not in METHODS:
        raise ValueError(f"{name!r}: the method is one of {', '.join(METHODS)}")
    rule, plus, flag = policy.partition("+")
    if plus and flag != "passive":
        raise ValueError(f"{name!r}: only +passive may follow a policy")
    if method == "peer" and (plus or rule == KEEP):
        raise ValueError(f"{name!r}: the peer takes a count or a rule, without +passive")
    if rule == KEEP:
        threads: int | str = KEEP
    elif rule in RULES:
        threads = RULES[rule](budget.cpus)
    elif rule.isascii() and rule.isdigit() and int(rule) > 0:
        threads = int(rule)
    else:
        raise ValueError(f"unknown policy {name!r}: {KEEP}, {', '.join(RULES)} or a count, each with +passive or not")
    return Candidate(name.strip(), threads, bool(plus), method)


def candidates(names: Sequence[str]) -> list[Candidate]:
    """The policies named (each once, in order) over the CPUs this process may use."""
    budget = cpu_budget()
    out = [candidate(n, budget) for n in names if n.strip()]
    if not out or len({c.name for c in out}) != len(out):
        raise ValueError("name each policy once, at least one")
    return out


@dataclass(frozen=True)
class RunSettings:
    rounds: int = 8
    per_turn: int = 3
    warmup: int = 2
    sizes: tuple[int, ...] = (512,)
    model: str | None = None
    settle: float = 1.0
    pictures: str = "new"  # one of PICTURES


def _stylizer(method: str, threads: str, model: str | None, pictures: str):
    """(stylize(content, style, seed=) -> image, its thread count, what it is) of a worker; ``pictures``: `PICTURES`."""
    if method == "peer":
        import onnxruntime

        from stylevar.baselines.magenta import MagentaConfig, MagentaStylizer

        peer = MagentaStylizer(MagentaConfig(threads=int(threads)))  # a count (`candidate` resolved the rule)
        return (lambda content, style, seed: peer(content, style)), int(threads), \
            f"onnxruntime {onnxruntime.__version__}"
    import torch
    from stylevar.pipelines.pipeline import StylePipeline
    pipe = StylePipeline.from_pretrained(model, device="cpu", threads=parse_threads(threads))
    pipe = pipe.uncached() if pictures == "new" else pipe  # new: as the peer, which computes its style every time
    if method == "served":
        from stylevar.runtime.inference import InferenceConfig, prepare

        prepare(pipe.model, InferenceConfig())
    return pipe, torch.get_num_threads(), f"torch {torch.__version__}"


def worker(method: str, threads: str, model: str | None, warmup: int, pictures: str) -> int:
    """The worker subprocess: "ready", then per "run N SIZE" line the seconds of N images; "quit" ends it."""
    from PIL import Image
    from stylevar.processing.images import scaled_size
    stylize, count, runtime = _stylizer(method, threads, model, pictures)
    examples = REPO / "stylevar" / "assets" / "examples"
    with Image.open(examples / CONTENT) as im:
        photo = im.convert("RGB")
    with Image.open(examples / STYLE) as im:
        style = im.convert("RGB")
    contents: dict[int, Image.Image] = {}
    seeds = iter(range(2**31))

    def one(size: int) -> tuple[float, float, tuple[int, int]]:
        t0, c0 = time.perf_counter(), time.process_time()
        out = stylize(contents[size], style, seed=next(seeds))
        return time.perf_counter() - t0, time.process_time() - c0, out.size

    _reply({"ready": True, "threads": count, "runtime": runtime, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")})
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        size = int(words[2])
        if size not in contents:
            contents[size] = photo.resize(scaled_size(photo.size, size), Image.LANCZOS)
            for _ in range(warmup):
                one(size)
        timed = [one(size) for _ in range(int(words[1]))]
        _reply({"wall": [t[0] for t in timed], "cpu": [t[1] for t in timed], "result_size": list(timed[-1][2])})
    return 0


def _reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class Worker:
    """One candidate's subprocess, its stderr in a temporary file."""

    def __init__(self, cand: Candidate, settings: RunSettings):
        self.candidate = cand
        self._err = tempfile.TemporaryFile()
        argv = [sys.executable, "-m", "benchmarks.threads", "--worker", str(cand.threads), "--method", cand.method,
                "--warmup", str(settings.warmup), "--pictures", settings.pictures] + \
            (["--model", settings.model] if settings.model else [])
        self.proc = subprocess.Popen(argv, cwd=REPO, env=cand.environment(dict(os.environ)), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._err, text=True)
        self.ready: dict = {}

    def reply(self) -> dict:
        """The worker's next JSON line (other output skipped); its stderr's end if it exits first."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                return json.loads(line)
        self.proc.wait()
        self._err.seek(0)
        tail = self._err.read().decode(errors="replace")[-3000:]
        raise RuntimeError(f"worker {self.candidate.name} exited with {self.proc.returncode}:\n{tail}")

    def wait_ready(self) -> dict:
        self.ready = self.reply()
        return self.ready

    def run(self, n: int, size: int) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"run {n} {size}\n")
        self.proc.stdin.flush()
        return self.reply()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._err.close()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def load(kind: str, settle: float, shares: list[float]) -> Iterator[None]:
    """``idle``, ``busy`` (another process's busy loop) or ``pinned`` (on the last CPU); its CPU share to ``shares``."""
    if kind == "idle":
        yield
        return
    hog = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
    try:
        if kind == "pinned":
            os.sched_setaffinity(hog.pid, {affinity_mask()[-1]})
        time.sleep(settle)
        t0, c0 = time.monotonic(), _cpu_seconds(hog.pid)
        yield
        shares.append((_cpu_seconds(hog.pid) - c0) / max(time.monotonic() - t0, 1e-9))
    finally:
        hog.terminate()
        hog.wait()
        time.sleep(settle)


def _rotated(items: Sequence, r: int) -> list:
    k = r % len(items)
    return list(items[k:]) + list(items[:k])


def measure(cands: Sequence[Candidate], loads: Sequence[str], settings: RunSettings,
            reference: Mapping[str, str] | None = None) -> dict:
    """Every worker started, then ``settings.rounds`` rounds of every load, size and candidate's turn."""
    started = _dt.datetime.now().isoformat(timespec="seconds")
    loadavg_start = os.getloadavg()
    workers = [Worker(c, settings) for c in cands]
    times = {ld: {c.name: {str(n): {"wall": [], "cpu": []} for n in settings.sizes} for c in cands} for ld in loads}
    shares: dict[str, list[float]] = {ld: [] for ld in loads}
    try:
        for w in workers:
            w.wait_ready()
        for r in range(settings.rounds):
            for ld in _rotated(loads, r):
                with load(ld, settings.settle, shares[ld]):
                    for size in _rotated(settings.sizes, r):
                        for w in _rotated(workers, r):
                            got = w.run(settings.per_turn, size)
                            w.ready.setdefault("result_size", {})[str(size)] = got["result_size"]
                            for key in ("wall", "cpu"):
                                times[ld][w.candidate.name][str(size)][key] += got[key]
    finally:
        for w in workers:
            w.stop()
    budget = cpu_budget()
    machine = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
               "cpu_count": os.cpu_count(), **asdict(budget), "cpus": budget.cpus,
               "loadavg_start": loadavg_start, "loadavg_end": os.getloadavg(),
               "runtimes": sorted({w.ready.get("runtime") for w in workers}), "python": platform.python_version()}
    policies = {w.candidate.name: {"method": w.candidate.method, "asked": w.candidate.threads,
                                   "threads": w.ready.get("threads"), "omp_wait_policy": w.ready.get("omp_wait_policy"),
                                   "result_size": w.ready.get("result_size")} for w in workers}
    return {"date": started, "machine": machine, "settings": {**asdict(settings), "loads": list(loads)},
            "reference": dict(reference or {}), "policies": policies, "busy_loop_cpu_share": shares, "times": times,
            "rows": rows(times, policies, reference or {})}


def _p(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def rows(times: dict, policies: dict, reference: Mapping[str, str]) -> list[dict]:
    """Per load, size and candidate: images, p50 / p90 s per image, p90 over its reference's, CPU s per image."""
    out = []
    for ld, per_policy in times.items():
        for name, per_size in per_policy.items():
            for size, t in per_size.items():
                ref_name = reference.get(name)
                ref = _p(per_policy[ref_name][size]["wall"], 90) if ref_name in per_policy else None
                p90 = _p(t["wall"], 90)
                out.append({"load": ld, "size": int(size), "policy": name, "method": policies[name]["method"],
                            "threads": policies[name]["threads"], "omp_wait_policy": policies[name]["omp_wait_policy"],
                            "images": len(t["wall"]), "p50_s": _p(t["wall"], 50), "p90_s": p90,
                            "reference": ref_name, "p90_over_reference": p90 / ref if ref and p90 is not None else None,
                            "cpu_p50_s": _p(t["cpu"], 50)})
    return out


def markdown(result: dict) -> str:
    def f(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    m, s = result["machine"], result["settings"]
    quota = "none" if m["quota"] is None else f"{m['quota']:g}"
    sizes = ", ".join(str(n) for n in s["sizes"])
    head = (f"{result['date']}, {m['processor']}, {m['cpus']} CPUs usable (affinity {m['affinity']}, cgroup quota "
            f"{quota}), {', '.join(m['runtimes'])}; load average {m['loadavg_start'][0]:.2f} -> "
            f"{m['loadavg_end'][0]:.2f}; {s['rounds']} rounds x {s['per_turn']} images per candidate, load and size "
            f"({sizes} px); pictures: {s['pictures']}")
    shares = ", ".join(f"{ld} {np.mean(v):.2f}" for ld, v in result["busy_loop_cpu_share"].items() if v)
    lines = [head + (f"; the busy loop's CPU share: {shares}" if shares else ""), "",
             "| load | px | policy | threads | OMP_WAIT_POLICY | images | p50 s | p90 s | p90 / reference's "
             "| CPU s per image |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        over = f"{f(r['p90_over_reference'], '.2f')} ({r['reference']})" if r["reference"] else "-"
        lines.append(f"| {r['load']} | {r['size']} | {r['policy']} | {r['threads']} | {r['omp_wait_policy'] or '-'} | "
                     f"{r['images']} | {f(r['p50_s'], '.3f')} | {f(r['p90_s'], '.3f')} | {over} | "
                     f"{f(r['cpu_p50_s'], '.3f')} |")
    return "\n".join(lines)


DEFAULT_POLICIES = "torch,available,available+passive,spare-one+passive,one"
LOADS = ("idle", "busy", "pinned")


def parse_loads(p: argparse.ArgumentParser, text: str) -> list[str]:
    """--loads as a list, or the parser's error (this benchmark's and `benchmarks.versus_peer`'s)."""
    loads = [x.strip() for x in text.split(",") if x.strip()]
    if not loads or any(x not in LOADS for x in loads):
        p.error(f"--loads: comma-separated, of {', '.join(LOADS)}; got {text}")
    return loads


def turn_arguments(p: argparse.ArgumentParser, rounds: int) -> None:
    """The options of the workers' turns (this benchmark's and `benchmarks.versus_peer`'s)."""
    p.add_argument("--loads", default="idle,busy", help=f"comma-separated, of {', '.join(LOADS)}")
    p.add_argument("--rounds", type=int, default=rounds,
                   help="rounds; in each, every load, size and candidate takes a turn")
    p.add_argument("--per-turn", type=int, default=3, help="images a candidate stylizes per turn")
    p.add_argument("--warmup", type=int, default=2, help="untimed images before a worker's first turn at a size")
    p.add_argument("--model", default=None, help="model directory (default: the demo model)")
    p.add_argument("--settle", type=float, default=1.0,
                   help="seconds between starting or stopping a load and the turns")
    p.add_argument("--pictures", default="new", choices=PICTURES,
                   help="what an image may reuse from the ones before it: new (nothing: ours' condition cache off, as "
                        "the peer keeps nothing) or repeated (ours finds both pictures' conditions in its cache)")
    p.add_argument("--out", type=Path, default=None, help="also write the results here (JSON)")


def run_settings(p: argparse.ArgumentParser, args: argparse.Namespace, sizes: tuple[int, ...]) -> RunSettings:
    """`turn_arguments`' options at ``sizes`` as `RunSettings`, or the parser's error."""
    if min(args.rounds, args.per_turn) < 1 or args.warmup < 0 or min(sizes) < 16:
        p.error("--rounds and --per-turn must be at least 1, --warmup at least 0, each size at least 16")
    return RunSettings(args.rounds, args.per_turn, args.warmup, sizes, args.model, args.settle, args.pictures)


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("benchmarks.threads", __doc__)
    p.add_argument("--policies", default=DEFAULT_POLICIES,
                   help="comma-separated: torch, available, spare-one, one or a count, each alone or with +passive")
    turn_arguments(p, rounds=8)
    p.add_argument("--size", type=int, default=512, help="long side of the content, and of the result, in pixels")
    p.add_argument("--worker", default=None, metavar="THREADS",
                   help="(what the run starts in each subprocess) serve turns with this count or 'torch' on "
                        "stdin/stdout")
    p.add_argument("--method", default="library", help="(with --worker) what the worker runs: library, served or peer")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.worker is not None:
        return worker(args.method, args.worker, args.model, args.warmup, args.pictures)
    loads, settings = parse_loads(p, args.loads), run_settings(p, args, (args.size,))
    try:
        chosen = candidates(args.policies.split(","))
    except ValueError as e:
        p.error(f"--policies: {e}")
    result = measure(chosen, loads, settings, reference={c.name: "one" for c in chosen})
    return emit(result, args.out, markdown(result))


if __name__ == "__main__":
    sys.exit(main())
