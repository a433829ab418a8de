"""Sustained open-loop overload of the service, run after run (loopback only, bounded in time).

    python -m benchmarks.overload [--rate 40] [--seconds 120] [--runs 2] [--model DIR] [--json OUT]

Starts `python -m serve` on the model (default: the demo model) with its default settings, then sends `POST /stylize`
at a fixed rate for `--seconds`, `--runs` times one after the other, whatever the answers (open loop). Per run: counts
by status, connection errors, p50/p99 of the 200s and of the 503s, the spread of `Retry-After`, and the server's RSS
at the start, its peak and at the end (from /proc, sampled every 0.25 s)."""
from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

from benchmarks.harness import command_parser, proc_mb, sample_rss_mb
from benchmarks.load_test import demo_image
from serve.testing import ServerProcess


async def one_run(url: str, pid: int, rate: float, seconds: float, files: dict) -> dict:
    statuses: Counter = Counter()
    ok_s, busy_s, busy_at, retry_after, errors = [], [], [], [], 0
    rss = [proc_mb(pid)]
    stop = time.monotonic() + seconds
    begun = time.perf_counter()

    async def request(c: httpx.AsyncClient) -> None:
        nonlocal errors
        t0 = time.perf_counter()
        try:
            r = await c.post(url + "/stylize", files=files, data={"seed": "1"})
        except httpx.HTTPError:
            errors += 1
            return
        dt = time.perf_counter() - t0
        statuses[r.status_code] += 1
        if r.status_code == 200:
            ok_s.append(dt)
        elif r.status_code == 503:
            busy_s.append(dt)
            busy_at.append(t0 - begun)
            if "retry-after" in r.headers:
                retry_after.append(int(r.headers["retry-after"]))

    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=120, limits=limits) as c:
        sampler = asyncio.create_task(sample_rss_mb(pid, stop, 0.25, rss))
        tasks, start = [], time.monotonic()
        for i in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            tasks.append(asyncio.create_task(request(c)))
        await asyncio.gather(*tasks)
        await sampler
    rss.append(proc_mb(pid))
    return {"sent": len(tasks), "status": dict(sorted(statuses.items())), "connection_errors": errors,
            **latencies(ok_s, busy_s, busy_at),
            "retry_after": [min(retry_after), max(retry_after)] if retry_after else None,
            "rss_mb": {"start": rss[0], "peak": max(rss), "end": rss[-1]}}


def pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def latencies(ok_s: list[float], busy_s: list[float], busy_at: list[float]) -> dict:
    """The answers' percentiles: 200s in seconds, 503s in milliseconds (also after the first 10 s of the run)."""
    return {"ok_p50_s": pct(ok_s, 50), "ok_p99_s": pct(ok_s, 99), "busy_p50_ms": pct([1000 * x for x in busy_s], 50),
            "busy_p99_ms": pct([1000 * x for x in busy_s], 99),
            # the same after the first 10 s (the start: no batch timed yet, so the queue fills before it refuses)
            "busy_p99_ms_after_10s": pct([1000 * x for x, at in zip(busy_s, busy_at) if at >= 10], 99)}


def markdown(rows: list[dict], settings: dict) -> str:
    lines = [f"Rate {settings['rate']}/s for {settings['seconds']} s per run, demo model, 2 cores, loopback.", "",
             "| run | sent | 200 | 503 | other | conn. errors | 200 p50 / p99 s | 503 p50 / p99 ms | Retry-After | "
             "RSS start / peak / end MB |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, r in enumerate(rows, 1):
        st = r["status"]
        other = sum(v for k, v in st.items() if k not in (200, 503))

        def f(x, spec):
            return "-" if x is None else format(x, spec)

        ra = "-" if r["retry_after"] is None else f"{r['retry_after'][0]}-{r['retry_after'][1]} s"
        m = r["rss_mb"]
        lines.append(f"| {i} | {r['sent']} | {st.get(200, 0)} | {st.get(503, 0)} | {other} | {r['connection_errors']} | "
                     f"{f(r['ok_p50_s'], '.2f')} / {f(r['ok_p99_s'], '.2f')} | {f(r['busy_p50_ms'], '.0f')} / "
                     f"{f(r['busy_p99_ms'], '.0f')} | {ra} | {m['start']:.0f} / {m['peak']:.0f} / {m['end']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = command_parser("benchmarks.overload", __doc__)
    p.add_argument("--rate", type=float, default=40.0, help="requests per second sent, whatever the answers")
    p.add_argument("--seconds", type=float, default=120.0, help="length of each run")
    p.add_argument("--runs", type=int, default=2, help="runs one after the other against the same server")
    p.add_argument("--model", type=Path, default=None, help="model directory (default: the demo model)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    if args.model is None:
        from stylevar.loaders.model_dir import DEMO_MODEL_DIR  # torch: once the options are parsed

        args.model = DEMO_MODEL_DIR
    files = {"content": ("c.png", demo_image(256, 192, 0), "image/png"),
             "style": ("s.png", demo_image(128, 128, 1), "image/png")}
    srv = ServerProcess.serve(args.model, settings={"STYLEVAR_THREADS": "auto"})
    try:
        srv.wait_ready()
        rows = [asyncio.run(one_run(srv.url, srv.proc.pid, args.rate, args.seconds, files)) for _ in range(args.runs)]
        server_errors = "Exception in ASGI application" in srv.log_text()
    finally:
        srv.stop()
    settings = {"rate": args.rate, "seconds": args.seconds}
    if args.json:
        args.json.write_text(json.dumps({"settings": settings, "runs": rows, "tracebacks_in_log": server_errors}, indent=1))
    print(markdown(rows, settings))
    print(f"tracebacks in the server log: {'yes' if server_errors else 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
