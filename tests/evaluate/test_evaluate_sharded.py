"""`torchrun --nproc-per-node 2 -m stylevar.evaluate`: the pairs are shared out between two processes
(gloo on the CPU) and process 0 writes the same results a single process writes."""
from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from serve.testing import free_port
from stylevar.evaluate.__main__ import main
from tests.conftest import single_thread_env
from tests.evaluate.test_evaluate import _manifest

pytestmark = pytest.mark.slow  # the fast lane (-m "not slow") leaves this file out

TIME = "seconds_per_image"


def _args(data, model_dir, out) -> list[str]:
    # batch size 1: three batches on the paired benchmark (two on process 0, one on process 1)
    return ["--method", str(model_dir), "--method", "reinhard", "--benchmark", f"paired={data['paired']}",
            "--benchmark", f"unpaired={data['unpaired']}", "--rows", "3", "--seed", "5", "--image-size", "32",
            "--batch-size", "1", "--metrics", "ssim", "ssim_standard", "--grid-rows", "2", "--out", str(out),
            "--quiet", "--no-warmup"]


def _results(out) -> tuple[list[dict], list[dict]]:
    samples = [{k: v for k, v in json.loads(line).items() if k != TIME} for line in open(out / "per_sample.jsonl")]
    rows = [{k: v for k, v in r.items() if k != TIME} for r in csv.DictReader(open(out / "results.csv"))]
    return samples, rows


@pytest.mark.slow
def test_two_processes_write_what_one_writes(micro_model_dir, tmp_path, one_thread):
    data = {"paired": _manifest(tmp_path / "paired", 3, True), "unpaired": _manifest(tmp_path / "unpaired", 2, False)}
    assert main(_args(data, micro_model_dir, tmp_path / "one")) == 0

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "stylevar.evaluate", *_args(data, micro_model_dir, tmp_path / "two")]
    done = subprocess.run(cmd, env=single_thread_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.count("# Evaluation") == 1  # process 0 reports

    one, two = _results(tmp_path / "one"), _results(tmp_path / "two")
    assert len(one[0]) == 2 * (3 + 2)
    assert two == one
    assert {p.name for p in (tmp_path / "two").iterdir()} == {p.name for p in (tmp_path / "one").iterdir()}
