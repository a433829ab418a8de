"""The heap policy (stylevar.utils.heap): the setting's values, freed memory reused instead of faulted in again (page
faults counted in a fresh process), decided once at the first model load, and the service's setting."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from stylevar.utils import heap

REPO = Path(__file__).resolve().parents[2]
GLIBC = platform.libc_ver()[0] == "glibc"

# six 8 MiB buffers alive at once, then all freed, ten times: the minor page faults of rounds 3 to 10
CHURN = """
import json, resource, sys
import numpy as np
from stylevar.utils import heap
choice = heap.apply_heap_policy()
faults = []
for _ in range(10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    bufs = [np.ones(8 << 20, np.uint8) for _ in range(6)]
    del bufs
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"keep_mb": choice.keep_mb, "source": choice.source, "faults": sum(faults[2:]) / 8}))
"""


def churn(env_value: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != heap.HEAP_ENV}
    if env_value is not None:
        env[heap.HEAP_ENV] = env_value
    out = subprocess.run([sys.executable, "-c", CHURN], env=env, cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_the_setting_takes_whole_mib_and_says_what_it_takes():
    assert heap.keep_mb({}) == heap.DEFAULT_KEEP_MB == 1024
    assert heap.keep_mb({heap.HEAP_ENV: " "}) == heap.DEFAULT_KEEP_MB
    assert heap.keep_mb({heap.HEAP_ENV: "0"}) == 0 and heap.keep_mb({heap.HEAP_ENV: "2047"}) == 2047
    for bad in ("-1", "1.5", "lots", "2048", "١٢"):
        with pytest.raises(ValueError, match=f"{heap.HEAP_ENV}=.*whole number of MiB from 0 to 2047"):
            heap.keep_mb({heap.HEAP_ENV: bad})


@pytest.mark.skipif(not GLIBC, reason="the policy sets glibc's thresholds; elsewhere nothing is set")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    kept, system = churn(None), churn("0")
    assert (kept["keep_mb"], kept["source"]) == (1024, "default")
    assert (system["keep_mb"], system["source"]) == (None, f"{heap.HEAP_ENV}=0")
    pages = 6 * (8 << 20) // 4096  # what one round touches
    # glibc's own thresholds hand most of the 48 MiB back every round (3058 faults of 12288 pages, measured)
    assert system["faults"] > 0.15 * pages, system
    assert kept["faults"] < 0.01 * pages, kept  # 0 measured
    assert churn("512")["source"] == heap.HEAP_ENV


@pytest.mark.slow  # a fresh process loads the demo model
def test_the_first_model_load_decides_once():
    script = ("from stylevar.pipelines.pipeline import StylePipeline\nfrom stylevar.utils import heap\n"
              "assert heap._decided is None\nStylePipeline.from_pretrained()\nfirst = heap._decided\n"
              "assert heap.apply_heap_policy({heap.HEAP_ENV: '0'}) is first\nprint(first.keep_mb)")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, heap.HEAP_ENV: "300"})
    assert out.stdout.split() == (["300"] if GLIBC else ["None"])


def test_the_service_setting_is_the_same_variable(monkeypatch):
    from serve.settings import ServeSettings

    monkeypatch.setenv(heap.HEAP_ENV, "64")
    assert ServeSettings().heap_keep_mb == 64
    monkeypatch.setenv(heap.HEAP_ENV, "4096")
    with pytest.raises(ValidationError, match="heap_keep_mb"):
        ServeSettings()
    monkeypatch.delenv(heap.HEAP_ENV)
    assert ServeSettings().heap_keep_mb == heap.DEFAULT_KEEP_MB
