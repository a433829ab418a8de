"""Ours and the pretrained peer side by side, in one run: seconds per image at the size users get back, at 1 and 2
threads, on an idle machine and with one core held by another process (`benchmarks.threads`' workers and turns).

    python -m benchmarks.versus_peer [--threads 1,2] [--sizes 512,1024] [--loads idle,busy] [--rounds 6]
        [--per-turn 3] [--warmup 2] [--pictures new] [--model DIR] [--out FILE]

"Ours" is the demo pipeline prepared as the command line and the service run it (OMP_WAIT_POLICY=PASSIVE where N > 1);
"the peer" is `stylevar.baselines.magenta` on onnxruntime. Without the peer installed, ours runs alone. `--pictures
repeated` lets ours find both pictures' conditions in its cache (the peer has none); `new` does not."""
from __future__ import annotations

import argparse
import sys

from benchmarks.harness import command_parser, emit
from benchmarks.threads import candidates, markdown, measure, parse_loads, run_settings, turn_arguments


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("benchmarks.versus_peer", __doc__)
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts, each run by ours and the peer")
    p.add_argument("--sizes", default="512,1024", help="comma-separated long sides of the content and the result, px")
    turn_arguments(p, rounds=6)
    return p


def _ints(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or min(values) < 1 or len(set(values)) != len(values):
        raise ValueError(text)
    return values


def names(counts: list[int], peer: bool) -> tuple[list[str], dict[str, str]]:
    """The candidates' names (`benchmarks.threads.candidate`) and which peer each of ours is compared with."""
    ours = {n: f"served:{n}" + ("+passive" if n > 1 else "") for n in counts}
    if not peer:
        return list(ours.values()), {}
    return [*ours.values(), *(f"peer:{n}" for n in counts)], {ours[n]: f"peer:{n}" for n in counts}


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    from stylevar.baselines.magenta import TeacherUnavailable, models_dir
    try:
        counts, sizes = _ints(args.threads), _ints(args.sizes)
    except ValueError:
        p.error("--threads and --sizes: distinct positive integers, comma-separated")
    loads, settings = parse_loads(p, args.loads), run_settings(p, args, tuple(sizes))
    try:
        models_dir()
        peer = True
    except TeacherUnavailable as e:
        print(f"the peer is not measured: {e}", file=sys.stderr)
        peer = False
    candidate_names, reference = names(counts, peer)
    result = measure(candidates(candidate_names), loads, settings, reference=reference)
    return emit(result, args.out, markdown(result))


if __name__ == "__main__":
    sys.exit(main())
