"""Run the real service in a subprocess on a free loopback port (for tests and benchmarks)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m serve` (or any command) in a subprocess; stderr goes to a log file for inspection."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], url: str, log_path: Path):
        self.argv, self.url, self.log_path = list(argv), url, log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(self.argv, env=dict(env), stdout=self._log, stderr=subprocess.STDOUT)

    @classmethod
    def serve(cls, model_dir: str | os.PathLike, *, settings: Mapping[str, str] | None = None,
              extra_args: Sequence[str] = ("--no-ui",), log_dir: str | os.PathLike | None = None) -> "ServerProcess":
        """`python -m serve --model DIR --port FREE` with `STYLEVAR_*` settings from `settings`."""
        port = free_port()
        env = {**os.environ, "STYLEVAR_DEVICE": "cpu", "STYLEVAR_THREADS": "1", **(settings or {})}
        argv = [sys.executable, "-m", "serve", "--host", "127.0.0.1", "--port", str(port), "--model",
                str(model_dir), *extra_args]
        log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="stylevar-serve-"))
        return cls(argv, env, f"http://127.0.0.1:{port}", log_dir / f"server-{port}.log")

    @classmethod
    def web(cls, api_url: str, *, env: Mapping[str, str] | None = None,
            log_dir: str | os.PathLike | None = None) -> "ServerProcess":
        """`python -m web --api URL --port FREE` (the standalone UI); ready when `/healthz` answers 200."""
        port = free_port()
        argv = [sys.executable, "-m", "web", "--api", api_url, "--port", str(port)]
        log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="stylevar-web-"))
        return cls(argv, {**os.environ, **(env or {})}, f"http://127.0.0.1:{port}", log_dir / f"web-{port}.log")

    def log_text(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def log_text_once(self, holds: Callable[[str], bool], timeout: float = 10.0) -> str:
        """The log as soon as ``holds(text)`` is true, or as it is after ``timeout`` seconds."""
        end = time.monotonic() + timeout
        text = self.log_text()
        while not holds(text) and time.monotonic() < end:
            time.sleep(0.05)
            text = self.log_text()
        return text

    def wait_ready(self, timeout: float = 120.0, path: str = "/readyz") -> "ServerProcess":
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}")
            try:
                if httpx.get(self.url + path, timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log_text()[-4000:]}")

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def raw_exchange(url: str, path: str, head: str, *parts: bytes, pause_s: float = 0.0, timeout: float = 10.0) -> str:
    """`POST path` on a plain socket, for what an HTTP client will not send: `head` (header lines), then each of
    `parts` `pause_s` apart; returns all the server sent until it closed (or reset the connection)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    answer = b""
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        try:
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{head}\r\n".encode("latin-1"))
            for i, part in enumerate(parts):
                if i and pause_s:
                    time.sleep(pause_s)
                s.sendall(part)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server has answered and closed: read what it sent
        try:
            while chunk := s.recv(4096):
                answer += chunk
        except ConnectionResetError:
            pass
    return answer.decode("latin-1")
