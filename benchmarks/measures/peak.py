"""The peak of a reading taken on a background thread while a block runs (`PeakSampler`): a process's resident
memory (benchmarks.upload_pressure, benchmarks.fullsize_memory), its GPU memory (the device run's service stage)."""
from __future__ import annotations

import threading
from collections.abc import Callable


class PeakSampler:
    """While entered, ``read()`` every ``every_s`` seconds (the first at once) on a thread; `peak` is the largest
    reading (``peak`` until one comes; a None reading is no reading)."""

    def __init__(self, read: Callable[[], float | None], every_s: float, peak: float | None = None):
        self.read, self.every_s, self.peak = read, every_s, peak
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            value = self.read()
            if value is not None:
                self.peak = value if self.peak is None else max(self.peak, value)
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
