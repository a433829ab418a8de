"""Closed-loop load test of a running StyleVAR service.

    python benchmarks/load_test.py --url http://127.0.0.1:8000 --concurrency 8 --seconds 30

C clients each send `POST /stylize` back to back for T seconds; prints requests/s, latency
percentiles and counts by status (`--json` prints the same as one JSON object).
"""
from __future__ import annotations

import asyncio
import io
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from benchmarks.harness import command_parser


@dataclass(frozen=True)
class LoadConfig:
    url: str
    concurrency: int
    seconds: float
    content: bytes
    style: bytes
    fields: dict[str, str] = field(default_factory=dict)
    api_key: str | None = None
    route: str = "/stylize"
    timeout_s: float = 120.0


@dataclass
class LoadResult:
    seconds: float
    latencies_s: list[float]
    statuses: Counter

    def summary(self) -> dict:
        total = sum(self.statuses.values())
        ok = self.statuses.get("200", 0)
        lat = np.asarray(self.latencies_s) * 1000.0 if self.latencies_s else np.zeros(1)
        return {
            "seconds": round(self.seconds, 3),
            "requests": total,
            "requests_per_s": round(total / self.seconds, 3),
            "ok_per_s": round(ok / self.seconds, 3),
            "p50_ms": round(float(np.percentile(lat, 50)), 1),
            "p95_ms": round(float(np.percentile(lat, 95)), 1),
            "p99_ms": round(float(np.percentile(lat, 99)), 1),
            "status_counts": dict(sorted(self.statuses.items())),
        }


def demo_image(w: int, h: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 255, (h // 8, w // 8, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr, "RGB").resize((w, h), Image.BICUBIC).save(buf, "PNG")
    return buf.getvalue()


async def run_load(cfg: LoadConfig) -> LoadResult:
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
    latencies: list[float] = []
    statuses: Counter = Counter()
    start = time.perf_counter()
    end = start + cfg.seconds

    async def client(c: httpx.AsyncClient) -> None:
        while time.perf_counter() < end:
            files = {"content": ("content.png", cfg.content, "image/png"),
                     "style": ("style.png", cfg.style, "image/png")}
            t0 = time.perf_counter()
            try:
                r = await c.post(cfg.route, files=files, data=cfg.fields)
                await r.aread()
                status = str(r.status_code)
            except httpx.HTTPError as e:
                status = f"error:{type(e).__name__}"
            latencies.append(time.perf_counter() - t0)
            statuses[status] += 1
            if status == "503":  # honour back-pressure a little, as a real client would
                await asyncio.sleep(0.05)

    async with httpx.AsyncClient(base_url=cfg.url, headers=headers, timeout=cfg.timeout_s, limits=limits) as c:
        await asyncio.gather(*[client(c) for _ in range(cfg.concurrency)])
    return LoadResult(time.perf_counter() - start, latencies, statuses)


def parse_fields(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--field takes KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    p = command_parser("benchmarks.load_test", __doc__)
    p.add_argument("--url", required=True, help="service base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--concurrency", type=int, default=8, help="clients sending back to back")
    p.add_argument("--seconds", type=float, default=30.0, help="test duration")
    p.add_argument("--content", type=Path, help="content image (default: a generated 256x192 PNG)")
    p.add_argument("--style", type=Path, help="style image (default: a generated 128x128 PNG)")
    p.add_argument("--field", action="append", default=[], help="extra form field KEY=VALUE (repeatable)")
    p.add_argument("--api-key", help="Bearer key, when the service requires one")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.concurrency < 1 or args.seconds <= 0:
        p.error("--concurrency must be >= 1 and --seconds > 0")
    cfg = LoadConfig(url=args.url.rstrip("/"), concurrency=args.concurrency, seconds=args.seconds,
                     content=args.content.read_bytes() if args.content else demo_image(256, 192, 0),
                     style=args.style.read_bytes() if args.style else demo_image(128, 128, 1),
                     fields=parse_fields(args.field), api_key=args.api_key)
    s = asyncio.run(run_load(cfg)).summary()
    if args.json:
        print(json.dumps(s))
    else:
        print(f"{s['requests']} requests in {s['seconds']:.1f} s with {cfg.concurrency} clients")
        print(f"requests/s: {s['requests_per_s']:.2f} (status 200: {s['ok_per_s']:.2f}/s)")
        print(f"latency ms: p50 {s['p50_ms']:.0f}  p95 {s['p95_ms']:.0f}  p99 {s['p99_ms']:.0f}")
        print("status counts: " + ", ".join(f"{k}: {v}" for k, v in s["status_counts"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
