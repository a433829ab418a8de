"""Torch's CPU threads on an idle and on a busy machine: seconds per image of the demo pipeline under each thread
policy (`stylevar.utils.threads`), alone and while another process holds a core, in one run.

    python -m benchmarks.threads [--policies torch,available,available+passive,spare-one+passive,one]
        [--loads idle,busy] [--rounds 8] [--per-turn 3] [--warmup 2] [--size 512] [--out benchmarks/results/threads.json]

Each policy runs in a subprocess of its own, started once, whose environment is set before it imports torch: this
shell's OMP_NUM_THREADS, MKL_NUM_THREADS, OMP_WAIT_POLICY, GOMP_SPINCOUNT and STYLEVAR_THREADS are left out, and
a policy with "+passive" gets OMP_WAIT_POLICY=PASSIVE (idle OpenMP threads sleep instead of spinning). Its count
goes to `StylePipeline.from_pretrained(threads=...)`: `torch` leaves torch's own count, `available` is the CPUs
this process may use (affinity mask and cgroup quota), `spare-one` one fewer (at least 1; the library's default
rule), `one` is 1, a number is that count. Each worker loads the demo pipeline as `StylePipeline.from_pretrained()`
does (no `prepare`) and waits for its turns (its first stylizes --warmup images untimed, then the timed ones); an
image is one call `pipe(content, style, seed=i)` on a bundled photograph resized to --size px on its long side (the
result comes back at that size: the demo model draws 64 px, upsampled), timed whole (wall and the worker's CPU
time, all threads).

The policies take turns, --per-turn images each, in an order that rotates every round; every round runs each
load: `idle` (nothing else started by this run), `busy` (a busy loop in another process, `while True: pass`, where
the scheduler puts it), `pinned` (the same loop pinned to the last CPU of the affinity mask). The loop starts
--settle seconds before its load's turns and is stopped after them; its CPU share is reported. Printed: a markdown
table per load and policy (threads, p50 and p90 seconds per image, p90 over the `one` policy's p90 in the same
load, CPU seconds per image); --out also writes every time, the machine and the settings as JSON.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.measures.report import emit
from stylevar.utils.helptext import RawDescriptionHelpFormatter

DEFAULT_POLICIES = "torch,available,available+passive,spare-one+passive,one"
LOADS = ("idle", "busy", "pinned")


def parse_loads(p: argparse.ArgumentParser, text: str) -> list[str]:
    """--loads as a list, or the parser's error (this script's and `benchmarks.versus_peer`'s)."""
    loads = [x.strip() for x in text.split(",") if x.strip()]
    if not loads or any(x not in LOADS for x in loads):
        p.error(f"--loads: comma-separated, of {', '.join(LOADS)}; got {text}")
    return loads


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.threads", description=__doc__,
                                formatter_class=RawDescriptionHelpFormatter)
    p.add_argument("--policies", default=DEFAULT_POLICIES,
                   help="comma-separated: torch, available, spare-one, one or a count, each alone or with +passive")
    p.add_argument("--loads", default="idle,busy", help=f"comma-separated, of {', '.join(LOADS)}")
    p.add_argument("--rounds", type=int, default=8, help="rounds; in each, every load and every policy takes a turn")
    p.add_argument("--per-turn", type=int, default=3, help="images a policy stylizes per turn")
    p.add_argument("--warmup", type=int, default=2, help="untimed images per worker after it loads")
    p.add_argument("--size", type=int, default=512, help="long side of the content, and of the result, in pixels")
    p.add_argument("--model", default=None, help="model directory (default: the demo model)")
    p.add_argument("--settle", type=float, default=1.0,
                   help="seconds between starting or stopping a load and the turns")
    p.add_argument("--out", type=Path, default=None, help="also write the results here (JSON)")
    p.add_argument("--worker", default=None, metavar="THREADS",
                   help="(what the run starts in each subprocess) serve turns with this count or 'torch' on "
                        "stdin/stdout")
    p.add_argument("--method", default="library", help="(with --worker) what the worker runs: library, served or peer")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    from benchmarks.measures import threads  # no torch until a worker loads its model

    if args.worker is not None:
        return threads.worker(args.method, args.worker, args.model, args.warmup)
    loads = parse_loads(p, args.loads)
    if min(args.rounds, args.per_turn) < 1 or args.warmup < 0 or args.size < 16:
        p.error("--rounds and --per-turn must be at least 1, --warmup at least 0, --size at least 16")
    try:
        candidates = threads.candidates(args.policies.split(","))
    except ValueError as e:
        p.error(f"--policies: {e}")
    settings = threads.RunSettings(args.rounds, args.per_turn, args.warmup, (args.size,), args.model, args.settle)
    result = threads.measure(candidates, loads, settings, reference={c.name: "one" for c in candidates})
    return emit(result, args.out, threads.markdown(result))


if __name__ == "__main__":
    sys.exit(main())
