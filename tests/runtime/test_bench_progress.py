"""`stylevar bench` reports progress on stderr (an estimate first) and keeps --json on stdout unchanged."""
from __future__ import annotations

import json

import pytest

from stylevar.runtime.bench import BenchConfig, estimate_seconds
from stylevar.cli import main as cli_main

pytestmark = pytest.mark.slow  # the fast lane (-m "not slow") leaves this file out


def test_progress_lines_go_to_stderr_and_json_stays_clean(capsys):
    rc = cli_main(["bench", "--preset", "tiny", "--batch-sizes", "1", "--repeats", "1", "--warmup", "0",
                   "--tf-batch", "1", "--json"])
    assert rc == 0
    out, err = capsys.readouterr()
    res = json.loads(out)  # stdout is the JSON result alone
    assert set(res) == {"preset", "device", "machine", "date", "compile", "dtype", "generate", "teacher_forcing",
                        "naive", "graphs"}
    assert res["graphs"] is None  # eager: no graph counts
    lines = err.splitlines()
    assert all(line.startswith("bench: ") for line in lines)
    estimate = next(i for i, line in enumerate(lines) if "the whole run will take about" in line)
    first_timed = next(i for i, line in enumerate(lines) if "ms/image" in line)
    assert estimate < first_timed
    for stage in ("built preset tiny", "generate at batch 1:", "teacher forcing at batch 1:"):
        assert any(stage in line for line in lines), stage


def test_estimate_grows_with_the_work():
    base = BenchConfig(batch_sizes=(1,), repeats=1, warmup=0, tf_batch=1)
    more = BenchConfig(batch_sizes=(1, 8), repeats=3, warmup=1, tf_batch=4, naive=True)
    assert 0 < estimate_seconds(base, 1.0) < estimate_seconds(more, 1.0)
    assert estimate_seconds(more, 2.0) == 2 * estimate_seconds(more, 1.0)
