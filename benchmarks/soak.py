"""Soak: ordinary traffic from a pool of clients while hostile requests run beside it (loopback only, bounded).

    python -m benchmarks.soak [--seconds 600] [--clients 4] [--max-requests 20000] [--skip PROBE,...] [--model DIR]
                              [--json OUT]

Starts `python -m serve` on the model (default: the demo model), sends `POST /stylize` from `--clients` clients while
the probes of `benchmarks.hostile` run from other loopback addresses, and reports the success rate and p50/p99, the
probes' statuses, every 5xx, peak RSS, file descriptors and temporary files before and after, tracebacks in the log."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

from benchmarks.harness import command_parser, proc_mb, sample_rss_mb
from benchmarks.hostile import BACKGROUND, PROBES, Sizes, pair, small_png
from serve.testing import ServerProcess

SETTLE_S = 10.0  # quiet after the run before the descriptors and temporary files are counted again


@dataclass
class Ordinary:
    """The ordinary requests' answers."""

    statuses: Counter = field(default_factory=Counter)
    ok_s: list[float] = field(default_factory=list)
    all_s: list[float] = field(default_factory=list)
    sent: int = 0

    def summary(self) -> dict:
        def pct(xs: list[float], q: float) -> float | None:
            return round(float(np.percentile(xs, q)), 3) if xs else None

        return {"sent": self.sent, "status": dict(sorted(self.statuses.items(), key=str)),
                "success_rate": round(self.statuses.get(200, 0) / self.sent, 4) if self.sent else None,
                "ok_p50_s": pct(self.ok_s, 50), "ok_p99_s": pct(self.ok_s, 99), "all_p99_s": pct(self.all_s, 99)}


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def temp_files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def machine() -> dict:
    return {"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "load_avg": os.getloadavg(),
            "python": platform.python_version(), "platform": platform.platform()}


async def ordinary_client(url: str, stop_at: float, max_requests: int, tally: Ordinary, files: dict) -> None:
    async with httpx.AsyncClient(timeout=120) as c:
        while time.monotonic() < stop_at and tally.sent < max_requests:
            tally.sent += 1
            t0 = time.perf_counter()
            try:
                r = await c.post(url + "/stylize", files=files, data={"seed": str(tally.sent)})
                status: int | str = r.status_code if r.status_code != 503 or "retry-after" not in r.headers \
                    else "503+retry"
            except httpx.HTTPError as e:
                status = type(e).__name__
            seconds = time.perf_counter() - t0
            tally.statuses[status] += 1
            tally.all_s.append(seconds)
            if status == 200:
                tally.ok_s.append(seconds)


async def hostile(url: str, probes: list, sizes: Sizes, stop_at: float, seen: list[dict]) -> None:
    """The probes in their order, again from the first while time is left."""
    while probes and time.monotonic() < stop_at:
        for probe in probes:
            if time.monotonic() >= stop_at:
                return
            await run_probe(url, probe, sizes, seen)


async def run_probe(url: str, probe, sizes: Sizes, seen: list[dict]) -> None:
    t0, began = time.perf_counter(), time.strftime("%H:%M:%S")
    try:
        result = await probe(url, sizes)
    except Exception as e:  # noqa: BLE001 - a probe that fails is a finding: recorded, not fatal
        result = {"failed": f"{type(e).__name__}: {e}"[:300]}
    seen.append({"probe": probe.__name__, "began": began, "seconds": round(time.perf_counter() - t0, 3), **result})


async def soak(url: str, pid: int, args: argparse.Namespace, sizes: Sizes) -> dict:
    tally, seen, rss = Ordinary(), [], []
    stop_at = time.monotonic() + args.seconds
    files = pair(small_png(0), small_png(1, 128))

    chosen = [p for p in (*BACKGROUND, *PROBES) if p.__name__ not in args.skip]
    background = [asyncio.create_task(run_probe(url, p, sizes, seen)) for p in chosen if p in BACKGROUND]
    hostile_task = asyncio.create_task(hostile(url, [p for p in chosen if p in PROBES], sizes, stop_at, seen))
    await asyncio.gather(sample_rss_mb(pid, stop_at, 0.5, rss),
                         *[ordinary_client(url, stop_at, args.max_requests, tally, files) for _ in range(args.clients)])
    hostile_task.cancel()  # the probe under way is stopped: its sockets close
    await asyncio.gather(hostile_task, *background, return_exceptions=True)
    return {"ordinary": tally.summary(), "hostile": seen,
            "rss_mb": {"start": rss[0] if rss else None, "peak_sampled": max(rss, default=None)}}


def server_5xx(srv: ServerProcess, offset: int) -> dict:
    """The service's own log from `offset` (the soak's start): answers of 500 or more by status, and tracebacks."""
    counts: Counter = Counter()
    text = srv.log_text()[offset:]
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("msg") == "request" and record.get("status", 0) >= 500:
            counts[record["status"]] += 1
    return {"by_status": dict(counts), "tracebacks": text.count("Traceback"),
            "unhandled": text.count("Exception in ASGI application")}


def run(args: argparse.Namespace, sizes: Sizes) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="stylevar-soak-"))
    srv = ServerProcess.serve(args.model, settings={"STYLEVAR_THREADS": "auto", "TMPDIR": str(tmp)})
    try:
        srv.wait_ready(300)
        pid, at_start = srv.proc.pid, machine()
        before = {"fds": open_fds(pid), "temp_files": temp_files(tmp), "rss_mb": proc_mb(pid)}
        log_start = len(srv.log_text())  # what startup logged (its /readyz 503s) is not the soak's
        result = asyncio.run(soak(srv.url, pid, args, sizes))
        time.sleep(SETTLE_S)
        after = {"fds": open_fds(pid), "temp_files": temp_files(tmp), "rss_mb": proc_mb(pid),
                 "peak_rss_mb": proc_mb(pid, "VmHWM")}
        errors = server_5xx(srv, log_start)
    finally:
        srv.stop()
    return {"settings": {"seconds": args.seconds, "clients": args.clients, "max_requests": args.max_requests,
                         "skipped": sorted(args.skip), "sizes": asdict(sizes)},
            "machine": {**at_start, "load_avg_end": os.getloadavg()}, "before": before, "after": after,
            "server_5xx": errors, **result}


def report(r: dict) -> str:
    o, b, a = r["ordinary"], r["before"], r["after"]
    m = r["machine"]
    lines = [f"{r['settings']['seconds']:g} s, {r['settings']['clients']} ordinary clients; machine: "
             f"{m['cpus']} CPUs, load {m['load_avg'][0]:.2f} -> {m['load_avg_end'][0]:.2f}",
             f"ordinary: {o['sent']} sent, success {o['success_rate']}, 200 p50 / p99 {o['ok_p50_s']} / "
             f"{o['ok_p99_s']} s, statuses {o['status']}",
             f"RSS: idle {b['rss_mb']:.0f} MB, peak {a['peak_rss_mb']:.0f} MB, end {a['rss_mb']:.0f} MB; "
             f"fds {b['fds']} -> {a['fds']}; temp files {len(b['temp_files'])} -> {len(a['temp_files'])}",
             f"server 5xx: {r['server_5xx']}"]
    lines += [f"  {h['probe']}: " + json.dumps({k: v for k, v in h.items() if k != "probe"}) for h in r["hostile"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = command_parser("benchmarks.soak", __doc__)
    p.add_argument("--seconds", type=float, default=600.0, help="how long the ordinary clients send")
    p.add_argument("--clients", type=int, default=4, help="ordinary clients, each one request at a time")
    p.add_argument("--max-requests", type=int, default=20_000, help="ordinary requests at most, in all")
    names = [probe.__name__ for probe in (*BACKGROUND, *PROBES)]
    p.add_argument("--skip", type=lambda s: set(filter(None, s.split(","))), default=set(),
                   help=f"probes left out, comma-separated, of: {', '.join(names)}")
    p.add_argument("--model", type=Path, default=None, help="model directory (default: the demo model)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    if args.skip - set(names):
        p.error(f"--skip: no probe named {', '.join(sorted(args.skip - set(names)))}")
    if args.model is None:
        from stylevar.loaders.model_dir import DEMO_MODEL_DIR  # torch: once the options are parsed

        args.model = DEMO_MODEL_DIR
    result = run(args, Sizes())
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
