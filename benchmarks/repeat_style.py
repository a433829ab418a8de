"""A style sent twice to the service: how much faster the second request is with the condition cache, and whether
its answer is exactly the uncached service's.

    python -m benchmarks.repeat_style [--size 1024] [--pairs 5] [--json OUT]

Starts the service twice on the demo model (CPU, one torch thread, no UI): one with its default settings (the
condition cache on, `STYLEVAR_CONDITION_CACHE_MB=256`), one with the cache off (`0`). For each pair (a bundled
photograph or example content, resized to --size px on its long side, and a bundled example style), one after
the other, each request sent to the cached service and then the same request to the uncached one:

1. ``first``: content A, style S, seed 0: nothing of it is cached yet;
2. ``seed sweep``: content A, style S, seeds 1 .. --sweep (what the UI's seed and strength sweeps send): both
   parts cached;
3. ``new content``: content B, style S, seed 0: the style's part cached.

The two services take turns on each request, which of them goes first alternating. Printed: per step, the median
seconds per request (client side, upload to the last byte) on both services and the median of the paired
differences (cached minus uncached, the same request), and whether every answer of the cached service decodes to
exactly the pixels of the uncached service's answer to the same request. The two services are up together;
requests are sent one at a time.
"""
from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from serve.settings import demo_model_dir
from serve.testing import ServerProcess
from benchmarks.measures.report import emit
from stylevar.processing.images import scaled_size
from stylevar.utils.helptext import RawDescriptionHelpFormatter

ASSETS = Path(__file__).resolve().parents[1] / "stylevar" / "assets"
STEPS = ("first", "seed sweep", "new content")


def pictures(size: int) -> tuple[list[bytes], list[bytes]]:
    """(contents, styles) as PNG bytes: the photographs and example contents at `size` px on the long side, and
    the example styles as they are."""
    def png(path: Path, side: int | None) -> bytes:
        with Image.open(path) as im:
            im = im.convert("RGB")
            if side:
                im = im.resize(scaled_size(im.size, side), Image.LANCZOS)
            buf = io.BytesIO()
            im.save(buf, "PNG")
            return buf.getvalue()

    contents = sorted((ASSETS / "photos").glob("*.png")) + sorted((ASSETS / "examples").glob("content_*.png"))
    return [png(p, size) for p in contents], [png(p, None) for p in sorted((ASSETS / "examples").glob("style_*.png"))]


def post(http: httpx.Client, content: bytes, style: bytes, seed: int) -> tuple[float, np.ndarray]:
    t0 = time.perf_counter()
    r = http.post("/stylize", files={"content": ("c.png", content, "image/png"), "style": ("s.png", style, "image/png")},
                  data={"seed": str(seed)})
    seconds = time.perf_counter() - t0
    if r.status_code != 200:
        raise RuntimeError(f"POST /stylize answered {r.status_code}: {r.text[:300]}")
    return seconds, np.asarray(Image.open(io.BytesIO(r.content)).convert("RGB"))


def run(size: int, pairs: int, sweep: int, model: str | None) -> dict:
    contents, styles = pictures(size)
    most = min(len(contents) // 2, len(styles) - 1)  # each pair its own pictures: nothing found cached by another
    if pairs > most:
        raise SystemExit(f"--pairs: at most {most} (the bundled pictures)")
    base = {"STYLEVAR_LOG_LEVEL": "WARNING"}
    times = {svc: {step: [] for step in STEPS} for svc in ("cached", "uncached")}
    identical, compared = 0, 0
    with ServerProcess.serve(model or demo_model_dir(), settings=base) as cached, \
            ServerProcess.serve(model or demo_model_dir(), settings={**base, "STYLEVAR_CONDITION_CACHE_MB": "0"}) as off:
        cached.wait_ready()
        off.wait_ready()
        with httpx.Client(base_url=cached.url, timeout=120) as a, httpx.Client(base_url=off.url, timeout=120) as b:
            for http in (a, b):  # one untimed request each: the first call's one-off costs
                post(http, styles[-1], styles[-1], 99)  # a picture no pair sends
            for j in range(pairs):
                requests = [("first", (contents[j], styles[j], 0))]
                requests += [("seed sweep", (contents[j], styles[j], seed)) for seed in range(1, sweep + 1)]
                requests += [("new content", (contents[-1 - j], styles[j], 0))]
                for step, request in requests:
                    if compared % 2 == 0:  # which service goes first alternates
                        (t_a, img_a), (t_b, img_b) = post(a, *request), post(b, *request)
                    else:
                        (t_b, img_b), (t_a, img_a) = post(b, *request), post(a, *request)
                    times["cached"][step].append(t_a)
                    times["uncached"][step].append(t_b)
                    identical += int(img_a.shape == img_b.shape and np.array_equal(img_a, img_b))
                    compared += 1
        stats = httpx.get(cached.url + "/metrics", timeout=10).text
    hits = [line for line in stats.splitlines() if line.startswith("stylevar_condition_cache_hits_total")]
    medians = {svc: {step: statistics.median(v) for step, v in per.items()} for svc, per in times.items()}
    paired = {step: statistics.median(x - y for x, y in zip(times["cached"][step], times["uncached"][step]))
              for step in STEPS}
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "size": size, "pairs": pairs, "sweep": sweep, "times": times,
            "medians": medians, "paired_difference": paired, "identical": identical, "compared": compared,
            "cache_hits": hits}


def markdown(report: dict) -> str:
    m = report["medians"]
    lines = [f"{report['date']}, demo model, 1 torch thread, contents {report['size']} px on the long side, "
             f"{report['pairs']} pairs, seed sweeps of {report['sweep']}; answers identical to the uncached service's: "
             f"{report['identical']} of {report['compared']}", "",
             "| request | requests | cached service, median s | uncached service, median s | "
             "paired difference, median ms |", "| --- | --- | --- | --- | --- |"]
    for step in STEPS:
        lines.append(f"| {step} | {len(report['times']['cached'][step])} | {m['cached'][step]:.3f} | "
                     f"{m['uncached'][step]:.3f} | {1000 * report['paired_difference'][step]:+.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.repeat_style", description=__doc__,
                                formatter_class=RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=1024, help="long side of the contents (and of the results), px")
    p.add_argument("--pairs", type=int, default=5, help="content-style pairs, each sent in the three steps")
    p.add_argument("--sweep", type=int, default=3, help="seeds of each pair's sweep (seeds 1 .. SWEEP)")
    p.add_argument("--model", default=None, help="model directory (default: the embedded demo model)")
    p.add_argument("--json", type=Path, help="also write the report here")
    args = p.parse_args(argv)
    if args.size < 16 or min(args.pairs, args.sweep) < 1:
        p.error("--size must be at least 16, --pairs and --sweep at least 1")
    report = run(args.size, args.pairs, args.sweep, args.model)
    return emit(report, args.json, markdown(report))


if __name__ == "__main__":
    sys.exit(main())
