"""Memory of full-size results under concurrency: bursts of large `POST /stylize` against `python -m serve`.

    python -m benchmarks.fullsize_memory [--side 6000] [--bursts 8,32] [--set STYLEVAR_NAME=VALUE ...] [--json OUT]

Makes two side x side PNGs that compress as photographs do (smooth colour gradients plus Gaussian noise of
`--noise` levels: about 49 MB each at 6000 px, where a solid colour is 100 KB), starts the service on the demo
model (CPU, one torch thread, no UI, its default settings but for an upload limit that admits the two files and
the `--set` ones), records its idle resident memory, then sends each burst of concurrent requests (content and
style those PNGs, each request its own seed) once the previous one has been answered. Per burst: the statuses,
whether every 503 carries `Retry-After`, the slowest answer of each status against the request deadline, and the
peak resident memory of the service during the burst (its high-water mark `VmHWM`, reset before the burst through
/proc/PID/clear_refs, and a sampler of `VmRSS` beside it) over the idle figure.

Targets (docs/serving.md, "Full-size results"): peak at most 1.2 GB over idle, no 5xx, every answer a 200 or a
503 with `Retry-After`, all within the deadline. Linux only (reads /proc).
"""
from __future__ import annotations

import argparse
import asyncio
import io
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from benchmarks.upload_pressure import RssSampler, rss_bytes
from serve.settings import ServeSettings, demo_model_dir
from serve.testing import ServerProcess
from benchmarks.measures.report import emit
from stylevar.utils.helptext import RawDescriptionHelpFormatter


def photo_like_png(side: int, noise: float, seed: int) -> bytes:
    """A side x side RGB PNG of smooth gradients and waves plus Gaussian noise (what keeps it from compressing
    to nothing, as a photograph's grain does)."""
    rng = np.random.default_rng(seed)
    out = np.empty((side, side, 3), np.uint8)
    for c, (a, b, phase) in enumerate(((180, 60, 0.0), (90, 120, 1.0), (40, 200, 2.0))):
        for top in range(0, side, 500):  # in bands: a few hundred MB less than the whole image in float
            y, x = np.mgrid[top:min(side, top + 500), 0:side].astype(np.float32) / side
            v = a * x + b * y + 30 * np.sin(6 * x + 4 * y + phase + seed) + 10
            v += rng.normal(0, noise, v.shape).astype(np.float32)
            out[top:top + 500, :, c] = np.clip(v, 0, 255)
    buf = io.BytesIO()
    Image.fromarray(out, "RGB").save(buf, "PNG")
    return buf.getvalue()


def images(side: int, noise: float, folder: Path | None) -> tuple[bytes, bytes]:
    """The content and style PNGs, made once and kept in `folder` when given (making them takes about half a
    minute each at 6000 px)."""
    out = []
    for seed in (0, 1):
        path = folder / f"photo-like-{side}-{noise:g}-{seed}.png" if folder is not None else None
        if path is not None and path.exists():
            out.append(path.read_bytes())
            continue
        out.append(photo_like_png(side, noise, seed))
        if path is not None:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_bytes(out[-1])
    return out[0], out[1]


def reset_peak(pid: int) -> bool:
    """Reset the process's resident high-water mark (Linux: "5" into clear_refs); False where that is refused."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def high_water_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


async def one_request(http: httpx.AsyncClient, files: dict, seed: int) -> dict:
    t0 = time.perf_counter()
    try:
        r = await http.post("/stylize", files=files, data={"seed": str(seed)})
    except httpx.HTTPError as e:
        return {"status": type(e).__name__, "seconds": time.perf_counter() - t0, "retry_after": None}
    return {"status": str(r.status_code), "seconds": time.perf_counter() - t0,
            "retry_after": r.headers.get("retry-after"), "error": None if r.status_code == 200 else error_code(r)}


def error_code(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"])
    except (ValueError, KeyError, TypeError):
        return r.text[:80]


async def burst(url: str, pid: int, n: int, files: dict) -> dict:
    """`n` concurrent requests; the service's peak memory while they are answered."""
    before = rss_bytes(pid)
    hwm = reset_peak(pid)
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        with RssSampler(pid, every_s=0.005) as sampler:
            t0 = time.perf_counter()
            answers = await asyncio.gather(*[one_request(http, files, seed) for seed in range(n)])
            seconds = time.perf_counter() - t0
    peak = max(sampler.peak, high_water_bytes(pid) if hwm else 0)
    return {"requests": n, "seconds": seconds, "rss_before": before, "peak": peak, "high_water_mark": hwm,
            "answers": answers}


def summary(result: dict, idle: int, deadline_s: float) -> dict:
    answers = result["answers"]
    statuses = Counter(a["status"] for a in answers)
    slowest = {s: round(max(a["seconds"] for a in answers if a["status"] == s), 2) for s in statuses}
    refused = [a for a in answers if a["status"] == "503"]
    return {"requests": result["requests"], "statuses": dict(statuses),
            "errors": dict(Counter(a.get("error") for a in answers if a["status"] != "200")),
            "503_with_retry_after": sum(a["retry_after"] is not None for a in refused), "503": len(refused),
            "slowest_s": slowest, "within_deadline": all(a["seconds"] <= deadline_s for a in answers),
            "burst_s": round(result["seconds"], 1), "rss_before_mb": round(result["rss_before"] / 2**20),
            "peak_mb": round(result["peak"] / 2**20), "added_mb": round((result["peak"] - idle) / 2**20),
            "peak_from": "VmHWM and VmRSS samples" if result["high_water_mark"] else "VmRSS samples"}


def markdown(report: dict) -> str:
    lines = [f"{report['side']} x {report['side']} PNGs (content {report['content_mb']} MB, style "
             f"{report['style_mb']} MB), idle RSS {report['idle_mb']} MB, deadline {report['deadline_s']:g} s.", "",
             "| concurrent | 200 | 503 (with Retry-After) | other | slowest 200 / 503 s | peak RSS MB | over idle MB |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for b in report["bursts"]:
        st = b["statuses"]
        other = {k: v for k, v in st.items() if k not in ("200", "503")}
        lines.append(f"| {b['requests']} | {st.get('200', 0)} | {b['503']} ({b['503_with_retry_after']}) | "
                     f"{other or 0} | {b['slowest_s'].get('200', '-')} / {b['slowest_s'].get('503', '-')} | "
                     f"{b['peak_mb']} | +{b['added_mb']} |")
    return "\n".join(lines)


def settings_of(pairs: list[str], upload_bytes: int) -> dict[str, str]:
    env = {"STYLEVAR_LOG_LEVEL": "WARNING", "STYLEVAR_MAX_UPLOAD_BYTES": str(upload_bytes + (1 << 20))}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.startswith("STYLEVAR_"):
            raise SystemExit(f"--set takes STYLEVAR_NAME=VALUE, not {pair!r}")
        env[name] = value
    return env


def run(args: argparse.Namespace) -> dict:
    content, style = images(args.side, args.noise, args.images)
    files = {"content": ("c.png", content, "image/png"), "style": ("s.png", style, "image/png")}
    env = settings_of(args.set, len(content) + len(style))
    deadline_s = float(env.get("STYLEVAR_REQUEST_TIMEOUT_S", ServeSettings.model_fields["request_timeout_s"].default))
    report = {"side": args.side, "content_mb": round(len(content) / 1e6, 1), "style_mb": round(len(style) / 1e6, 1),
              "settings": env, "deadline_s": deadline_s, "bursts": []}
    with ServerProcess.serve(args.model or demo_model_dir(), settings=env) as srv:
        srv.wait_ready()
        time.sleep(2.0)  # the warm-up's memory settles
        idle = rss_bytes(srv.proc.pid)
        report["idle_mb"] = round(idle / 2**20)
        for n in args.bursts:
            result = asyncio.run(burst(srv.url, srv.proc.pid, n, files))
            report["bursts"].append(summary(result, idle, deadline_s))
            time.sleep(args.pause_s)
        report["tracebacks_in_log"] = srv.log_text().count("Traceback")
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fullsize_memory", description=__doc__,
                                formatter_class=RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model directory (default: the embedded demo model)")
    p.add_argument("--side", type=int, default=6000, help="side of the square PNGs (6000: 36 MP)")
    p.add_argument("--noise", type=float, default=2.0, help="standard deviation of the noise, in 8-bit levels")
    p.add_argument("--images", type=Path, help="folder to keep the generated PNGs in and reuse them from")
    p.add_argument("--bursts", type=lambda s: [int(x) for x in s.split(",")], default=[8, 32],
                   help="concurrent requests of each burst, comma-separated, sent one burst after the other")
    p.add_argument("--pause-s", type=float, default=3.0, help="seconds between two bursts")
    p.add_argument("--set", action="append", default=[], metavar="STYLEVAR_NAME=VALUE",
                   help="a service setting (repeatable)")
    p.add_argument("--json", type=Path, help="also write the report here")
    args = p.parse_args(argv)
    report = run(args)
    return emit(report, args.json, markdown(report))


if __name__ == "__main__":
    sys.exit(main())
