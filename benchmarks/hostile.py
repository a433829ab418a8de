"""Hostile requests for `benchmarks.soak`: each probe of the reliability checks, on loopback.

Every probe is a coroutine `probe(url, sizes) -> dict` sending from a loopback address of its own (127.0.0.x: the
per-client connection limit counts it apart) and returning the statuses and seconds of its answers. `PROBES`
lists them in the order the soak runs them.
"""
from __future__ import annotations

import asyncio
import io
import socket
import struct
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
import numpy as np
from PIL import Image

from benchmarks.load_test import demo_image


@dataclass(frozen=True)
class Sizes:
    """How large the hostile payloads are (the defaults: the soak's)."""

    stream_side: tuple[int, int] = (3580, 3574)  # the unread streams' content, 4 samples each
    big_side: int = 6000  # the 36 MP burst's PNGs and the slow readers'
    burst: int = 8
    slow_readers: int = 6
    scans: int = 20_000  # the progressive JPEG's repeated AC scans
    scan_side: int = 6000
    hold_s: float = 60.0  # how long the unread sockets stay open


def gradient_png(w: int, h: int, level: int = 1) -> bytes:
    buf = io.BytesIO()
    Image.linear_gradient("L").resize((w, h)).convert("RGB").save(buf, "PNG", compress_level=level)
    return buf.getvalue()


def small_png(seed: int, side: int = 256) -> bytes:
    return demo_image(side, side, seed)


def ztxt_bomb() -> bytes:
    """A small PNG with a zTXt chunk that inflates to 64 MB."""
    png = small_png(7, 64)
    data = b"k\x00\x00" + zlib.compress(b"a" * (64 << 20), 9)
    chunk = struct.pack(">I", len(data)) + b"zTXt" + data + struct.pack(">I", zlib.crc32(b"zTXt" + data))
    return png[:33] + chunk + png[33:]


def scan_bomb(side: int, scans: int) -> bytes:
    """A valid progressive JPEG whose last scan is repeated `scans` times (decode time grows with the scans)."""
    buf = io.BytesIO()
    Image.linear_gradient("L").resize((side, side)).convert("RGB").save(buf, "JPEG", progressive=True, quality=30)
    data = buf.getvalue()
    last = data.rindex(b"\xff\xda")
    return data[:last] + data[last:-2] * scans + b"\xff\xd9"


def clip_bytes(frames: int, size: tuple[int, int], fmt: str, fps: int = 30) -> bytes:
    """A clip of `frames` flat frames, H.264 in `fmt` (Matroska writes no frame count in its header)."""
    import av
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as c:
        v = c.add_stream("libx264", rate=fps, options={"preset": "ultrafast"})
        v.width, v.height, v.pix_fmt = size[0], size[1], "yuv420p"
        for i in range(frames):
            picture = np.full((size[1], size[0], 3), i % 256, np.uint8)
            c.mux(v.encode(av.VideoFrame.from_ndarray(picture, "rgb24")))
        c.mux(v.encode(None))
    return buf.getvalue()


def multipart(url: str, path: str, files: dict, data: dict | None = None) -> bytes:
    """A whole HTTP/1.1 POST with a multipart body, as bytes for a raw socket."""
    request = httpx.Request("POST", url + path, files=files, data=data)
    request.read()
    head = "".join(f"{k}: {v}\r\n" for k, v in request.headers.items())
    return f"POST {path} HTTP/1.1\r\n{head}\r\n".encode("latin-1") + request.content


async def raw_socket(url: str, address: str, rcvbuf: int | None = None) -> tuple[asyncio.StreamReader,
                                                                                 asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.bind((address, 0))
    s.setblocking(False)
    await asyncio.get_running_loop().sock_connect(s, (host, int(port)))
    return await asyncio.open_connection(sock=s)


async def held_unread(url: str, address: str, request: bytes, hold_s: float) -> str:
    """Send `request`, read nothing for `hold_s`, then read what is left: "complete STATUS" when the whole answer
    came, "cut STATUS" when the server ended the connection before it, "open" when it did neither in 10 s."""
    reader, writer = await raw_socket(url, address, rcvbuf=4096)
    writer.write(request)
    await writer.drain()
    await asyncio.sleep(hold_s)
    data, ended = b"", True
    try:
        while chunk := await asyncio.wait_for(reader.read(1 << 20), 10):
            data += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    except asyncio.TimeoutError:
        ended = False
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1].decode() if head.count(b" ") >= 2 else "-"
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length")), None)
    complete = len(body) == length if length is not None else body.endswith(b"0\r\n\r\n")
    return f"complete {status}" if complete else f"cut {status}" if ended else "open"


def client(address: str, timeout: float = 120) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=timeout, transport=httpx.AsyncHTTPTransport(local_address=address))


async def timed(send: Awaitable[httpx.Response]) -> tuple[int | str, float]:
    t0 = time.perf_counter()
    try:
        r = await send
    except httpx.HTTPError as e:
        return type(e).__name__, round(time.perf_counter() - t0, 3)
    code = r.status_code if r.status_code < 500 or "retry-after" not in r.headers else f"{r.status_code}+retry"
    return code if r.status_code < 400 else f"{code} {error_of(r)}", round(time.perf_counter() - t0, 3)


def error_of(r: httpx.Response) -> str:
    try:
        return r.json().get("error", "")
    except ValueError:
        return ""


def pair(content: bytes, style: bytes) -> dict:
    return {"content": ("c.png", content, "image/png"), "style": ("s.png", style, "image/png")}


async def unread_streams(url: str, sizes: Sizes) -> dict:
    """Two event streams of a large content, 4 samples each, never read."""
    files = pair(gradient_png(*sizes.stream_side), small_png(1))
    request = multipart(url, "/stylize/stream", files, {"num_samples": "4"})
    outcomes = await asyncio.gather(*[held_unread(url, "127.0.0.2", request, sizes.hold_s) for _ in range(2)])
    return {"outcomes": outcomes}


async def slow_readers(url: str, sizes: Sizes) -> dict:
    """Clients that never read their full-size results."""
    request = multipart(url, "/stylize", pair(gradient_png(sizes.big_side, sizes.big_side), small_png(2)))
    outcomes = await asyncio.gather(*[held_unread(url, "127.0.0.3", request, sizes.hold_s)
                                      for _ in range(sizes.slow_readers)])
    return {"outcomes": outcomes}


async def made_up_methods(url: str, sizes: Sizes) -> dict:
    """3,000 requests with made-up methods, then the size and time of a scrape."""
    statuses: Counter = Counter()
    async with client("127.0.0.4", 30) as c:
        before = len((await c.get(url + "/metrics")).content)
        for start in range(0, 3000, 20):
            answers = await asyncio.gather(*[timed(c.request(f"M{i:07X}", url + "/healthz"))
                                             for i in range(start, start + 20)])
            statuses.update(status for status, _ in answers)
        t0 = time.perf_counter()
        after = len((await c.get(url + "/metrics")).content)
        return {"statuses": dict(statuses), "metrics_bytes_before": before, "metrics_bytes_after": after,
                "scrape_s": round(time.perf_counter() - t0, 3)}


async def burst_after_tiny(url: str, sizes: Sizes) -> dict:
    """Two tiny requests (one refused), then concurrent 36 MP PNGs."""
    big = gradient_png(sizes.big_side, sizes.big_side)
    async with client("127.0.0.5", 180) as c:
        tiny = [await timed(c.post(url + "/stylize", files=pair(small_png(3, 64), small_png(4, 64)))),
                await timed(c.post(url + "/stylize", files=pair(b"not an image", small_png(4, 64))))]
        burst = await asyncio.gather(*[timed(c.post(url + "/stylize", files=pair(big, small_png(5))))
                                       for _ in range(sizes.burst)])
    return {"tiny": tiny, "burst": burst}


async def scan_bomb_style(url: str, sizes: Sizes) -> dict:
    """A progressive JPEG of many scans as the style, twice."""
    bomb = scan_bomb(sizes.scan_side, sizes.scans)
    files = {"content": ("c.png", small_png(6), "image/png"), "style": ("s.jpg", bomb, "image/jpeg")}
    async with client("127.0.0.6", 180) as c:
        return {"bytes": len(bomb), "answers": await asyncio.gather(
            *[timed(c.post(url + "/stylize", files=files)) for _ in range(2)])}


async def bad_videos(url: str, sizes: Sizes) -> dict:
    """An MKV with no frame count and 301 frames; 3,000 frames of 2 x 2 px."""
    async with client("127.0.0.7", 180) as c:
        answers = []
        for name, data in (("mkv-301.mkv", clip_bytes(301, (64, 48), "matroska")),
                           ("tiny-3000.mkv", clip_bytes(3000, (2, 2), "matroska", fps=300))):
            answers.append(await timed(c.post(url + "/stylize/video", files={
                "video": (name, data, "video/x-matroska"), "style": ("s.png", small_png(8), "image/png")})))
    return {"answers": answers}


async def stalled_upload(url: str, sizes: Sizes) -> dict:
    """A Content-Length of 100 kB, 1 kB sent, then nothing."""
    reader, writer = await raw_socket(url, "127.0.0.8")
    t0 = time.perf_counter()
    writer.write(b"POST /stylize HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                 b"Content-Length: 100000\r\n\r\n--b\r\n" + b"x" * 1024)
    answer = await asyncio.wait_for(reader.read(), 60)
    writer.close()
    return {"status_line": answer.split(b"\r\n", 1)[0].decode("latin-1"), "seconds": round(time.perf_counter() - t0, 3)}


async def connection_flood(url: str, sizes: Sizes) -> dict:
    """Many idle connections from one address, then one request more from it."""
    held = [await raw_socket(url, "127.0.0.9") for _ in range(40)]
    await asyncio.sleep(0.5)
    async with client("127.0.0.9", 30) as c:
        answer = await timed(c.get(url + "/v1/model"))
    for _, writer in held:
        writer.close()
    return {"connections": len(held), "one_more": answer}


async def form_abuse(url: str, sizes: Sizes) -> dict:
    """Form abuse: a zTXt bomb, alphas nested 100,000 deep, style weights of 1e39."""
    async with client("127.0.0.10", 60) as c:
        post = c.post
        return {"ztxt_bomb": await timed(post(url + "/stylize", files=pair(ztxt_bomb(), small_png(9)))),
                "deep_alphas": await timed(post(url + "/stylize", files=pair(small_png(10), small_png(11)),
                                                data={"alphas": "[" * 100_000 + "]" * 100_000})),
                "weights_1e39": await timed(post(url + "/stylize", files=[
                    ("content", ("c.png", small_png(12), "image/png")),
                    ("style", ("a.png", small_png(13), "image/png")), ("style", ("b.png", small_png(14), "image/png"))],
                    data={"style_weights": "1e39,1"}))}


Probe = Callable[[str, Sizes], Awaitable[dict]]
# in the order the soak runs them; the unread streams and the slow readers hold their sockets in the background
BACKGROUND: tuple[Probe, ...] = (unread_streams,)
PROBES: tuple[Probe, ...] = (made_up_methods, form_abuse, connection_flood, bad_videos, stalled_upload,
                             burst_after_tiny, scan_bomb_style, slow_readers)
