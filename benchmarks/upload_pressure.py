"""Upload pressure on `python -m serve`: memory under large uploads, and how fast a full queue refuses.

    python -m benchmarks.upload_pressure [--model DIR] [--requests 8] [--side 6000] [--json]

Starts the service (CPU, one torch thread, no UI) with a queue of `--requests` slots, sends that many concurrent
`POST /stylize` with two solid-colour side x side PNGs each (36 MP at the default side) while sampling the server's
resident memory, and meanwhile times the 503s of the same request sent again. Linux only (reads /proc).
Targets: added RSS < 1 GB, 503 in < 100 ms.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import struct
import sys
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field

import httpx

from benchmarks.harness import RssSampler, proc_bytes
from serve.settings import demo_model_dir
from serve.testing import ServerProcess
from stylevar.utils.helptext import HelpFormatter


def solid_png(side: int, rgb: tuple[int, int, int]) -> bytes:
    """A solid-colour RGB PNG made without ever holding its pixels."""
    row = b"\x00" + bytes(rgb) * side
    z = zlib.compressobj(9)
    idat = b"".join(z.compress(row) for _ in range(side)) + z.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


@dataclass
class Report:
    requests: int
    side: int
    upload_bytes: int
    idle_rss_mb: float = 0.0
    peak_rss_mb: float = 0.0
    added_rss_mb: float = 0.0
    burst_seconds: float = 0.0
    statuses: Counter = field(default_factory=Counter)
    refusals_ms: list[float] = field(default_factory=list)
    probe_statuses: Counter = field(default_factory=Counter)

    def summary(self) -> dict:
        ms = self.refusals_ms
        return {
            "requests": self.requests, "megapixels_per_image": round(self.side * self.side / 1e6, 1),
            "upload_bytes_per_request": self.upload_bytes,
            "idle_rss_mb": round(self.idle_rss_mb, 1), "peak_rss_mb": round(self.peak_rss_mb, 1),
            "added_rss_mb": round(self.added_rss_mb, 1), "burst_seconds": round(self.burst_seconds, 2),
            "burst_statuses": dict(self.statuses), "probe_statuses": dict(self.probe_statuses),
            "refusals": len(ms),
            "refusal_ms_median": round(statistics.median(ms), 1) if ms else None,
            "refusal_ms_max": round(max(ms), 1) if ms else None,
        }


async def run(url: str, pid: int, args: argparse.Namespace) -> Report:
    files = [{"content": ("c.png", solid_png(args.side, (200, 30 + i, 40)), "image/png"),
              "style": ("s.png", solid_png(args.side, (20, 90, 200 - i)), "image/png")} for i in range(args.requests)]
    report = Report(args.requests, args.side, sum(len(f[1]) for f in files[0].values()))
    report.idle_rss_mb = proc_bytes(pid) / 2**20
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        with RssSampler(pid) as sampler:
            t0 = time.perf_counter()
            burst = [asyncio.create_task(http.post("/stylize", files=f, data={"seed": str(i)}))
                     for i, f in enumerate(files)]
            await asyncio.sleep(args.probe_delay_s)  # the burst has arrived and holds every queue slot
            while not all(t.done() for t in burst) and len(report.refusals_ms) < args.probes:
                p0 = time.perf_counter()
                r = await http.post("/stylize", files=files[0])
                report.probe_statuses[str(r.status_code)] += 1
                if r.status_code == 503:
                    report.refusals_ms.append((time.perf_counter() - p0) * 1000)
                await asyncio.sleep(0.02)
            responses = await asyncio.gather(*burst)
            report.burst_seconds = time.perf_counter() - t0
        report.statuses.update(str(r.status_code) for r in responses)
        report.peak_rss_mb = sampler.peak / 2**20
    report.added_rss_mb = report.peak_rss_mb - report.idle_rss_mb
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.upload_pressure", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--model", default=None, help="model directory (default: the embedded demo model)")
    p.add_argument("--requests", type=int, default=8, help="concurrent uploads, also the queue size")
    p.add_argument("--side", type=int, default=6000, help="side of the square PNGs (6000: 36 MP)")
    p.add_argument("--probes", type=int, default=10, help="refused requests to time")
    p.add_argument("--probe-delay-s", type=float, default=0.5, help="wait before the first probe, seconds")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    model = args.model or demo_model_dir()
    settings = {"STYLEVAR_QUEUE_SIZE": str(args.requests), "STYLEVAR_LOG_LEVEL": "WARNING",
                "STYLEVAR_MAX_UPLOAD_BYTES": str(64 << 20)}
    with ServerProcess.serve(model, settings=settings) as srv:
        srv.wait_ready()
        time.sleep(1.0)  # let the warm-up's memory settle
        report = asyncio.run(run(srv.url, srv.proc.pid, args))
    s = report.summary()
    if args.json:
        print(json.dumps(s))
    else:
        print(f"{s['requests']} concurrent requests, two {s['megapixels_per_image']} MP PNGs each "
              f"({s['upload_bytes_per_request']} bytes per request)")
        print(f"server RSS: idle {s['idle_rss_mb']} MB, peak {s['peak_rss_mb']} MB, added {s['added_rss_mb']} MB "
              "(target < 1024 MB)")
        print(f"burst: {s['burst_seconds']} s, statuses {s['burst_statuses']}")
        print(f"full queue: {s['refusals']} refusals (503), median {s['refusal_ms_median']} ms, "
              f"max {s['refusal_ms_max']} ms (target < 100 ms); probe statuses {s['probe_statuses']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
