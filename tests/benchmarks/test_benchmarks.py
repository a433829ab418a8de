"""The CPU and GPU inference benchmarks: benchmarks/cpu_pipeline.py (stage by stage on the CPU) runs end to end
on its reference-shaped configuration, benchmarks/reference_pipeline.py says how to get the reference when
no checkout of it is importable, and benchmarks/gpu_bench.sh (the GPU figures) records its rows and
regenerates the table (run here on the CPU with the tiny preset)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks import cpu_pipeline
from benchmarks.side_by_side import STAGES
from tests.training.test_sft import REPO

pytestmark = pytest.mark.slow  # the fast lane (-m "not slow") leaves this file out


def test_stage_benchmark_times_every_precision_and_measures_agreement(capsys):
    rc = cpu_pipeline.main(["--batch-sizes", "1", "--repeats", "1", "--warmup", "0", "--precisions", "fp32,bf16",
                            "--agreement-seeds", "1", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    stages = out["stages_ms_per_image"]["1"]
    assert set(stages) == {"plain", "fp32", "bf16"}
    assert all(set(st) == set(STAGES) and all(v > 0 for v in st.values()) for st in stages.values())
    assert set(out["token_agreement_with_fp32"]) == {"bf16"}
    assert all(0.5 < a <= 1 for a in out["token_agreement_with_fp32"].values())


def test_unknown_precision_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        cpu_pipeline.main(["--precisions", "fp32,int4"])
    assert e.value.code == 2
    assert "--precisions" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # removed: refused saying why
        cpu_pipeline.main(["--precisions", "fp32,int8"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "int8 was removed" in err and "torchao" in err and "fp32, bf16" in err


def test_reference_missing_exits_2_naming_the_repository():
    # no checkout of the reference on the path: one line naming where to get it, before any model is built
    for module in ("benchmarks.reference_pipeline", "benchmarks.cpu_pipeline"):
        args = [sys.executable, "-m", module, "--batch-sizes", "1"] + (["--reference"] if "cpu" in module else [])
        r = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, (module, r.stderr)
        assert "github.com/Senfier-LiqiJing/StyleVAR" in r.stderr and "PYTHONPATH" in r.stderr


def test_gpu_bench_script_writes_its_figures_to_the_given_folder_only(tmp_path):
    readme = (REPO / "benchmarks" / "README.md").read_text()
    out = tmp_path / "figures"
    env = {**os.environ, "PRESET": "tiny", "DEVICE": "cpu", "BATCHES": "1", "MODES": "eager", "PYTHON": sys.executable,
           # the training step at a CPU's size: compiling the blocks and emulated bf16 cost minutes here
           "TRAIN_BATCHES": "2", "TRAIN_PRECISION": "fp32", "TRAIN_VARIANT": "eager"}
    script = str(REPO / "benchmarks" / "gpu_bench.sh")
    r = subprocess.run(["bash", script, str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["preset"] == "tiny" and rows[0]["generate"][0]["batch"] == 1
    assert "| tiny | cpu |" in (out / "table.md").read_text()
    assert (REPO / "benchmarks" / "README.md").read_text() == readme, "the checkout's README is left alone"
    step = json.loads((out / "train_step_tiny.json").read_text())["steps"]
    assert list(step) == ["fp32 batch 2"] and step["fp32 batch 2"]["eager"]["ms_per_step"] > 0
    assert "mfu" not in step["fp32 batch 2"]["eager"], "no peak on a CPU: no MFU"
    bad = subprocess.run(["bash", script, str(out)], env={**env, "MODES": "graphs"}, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "unknown mode" in bad.stderr
    usage = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "OUTDIR" in usage.stderr


def test_gpu_bench_script_says_how_to_install_the_project(tmp_path):
    """A python without the project: exit 2 naming the install command (INSTALL=1 would run it)."""
    bare = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    env = {**os.environ, "PYTHON": str(bare / "bin" / "python"), "PYTHONPATH": ""}
    r = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_bench.sh"), str(tmp_path / "out")], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "the project is not installed" in r.stderr and "pip install -e ." in r.stderr


def test_overload_benchmark_runs_and_reports_every_figure(tiny_model_dir, tmp_path, capsys):
    from benchmarks import overload

    out = tmp_path / "overload.json"
    assert overload.main(["--rate", "4", "--seconds", "1.5", "--runs", "2", "--model", str(tiny_model_dir),
                          "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert len(result["runs"]) == 2 and not result["tracebacks_in_log"]
    for run in result["runs"]:
        assert run["sent"] == 6 and sum(run["status"].values()) + run["connection_errors"] == 6
        assert set(run["rss_mb"]) == {"start", "peak", "end"} and run["rss_mb"]["peak"] >= run["rss_mb"]["start"]
    table = capsys.readouterr().out
    assert "| run | sent | 200 | 503 |" in table and table.count("\n| 1 |") == 1


def test_fullsize_memory_benchmark_reports_each_burst(tiny_model_dir, tmp_path, capsys):
    """Small images and a budget of one request at a time: each burst's statuses add up, the peak is measured."""
    from benchmarks import fullsize_memory

    out = tmp_path / "fullsize.json"
    assert fullsize_memory.main(["--side", "400", "--bursts", "2,3", "--pause-s", "0.2", "--model", str(tiny_model_dir),
                                 "--images", str(tmp_path / "img"), "--set", "STYLEVAR_MAX_PIXELS_IN_FLIGHT=400000",
                                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [b["requests"] for b in report["bursts"]] == [2, 3] and not report["tracebacks_in_log"]
    for burst in report["bursts"]:
        assert sum(burst["statuses"].values()) == burst["requests"] and burst["within_deadline"]
        assert burst["peak_mb"] >= burst["rss_before_mb"] > 0
    assert report["settings"]["STYLEVAR_MAX_PIXELS_IN_FLIGHT"] == "400000"
    assert sorted(p.name for p in (tmp_path / "img").iterdir()) == ["photo-like-400-2-0.png", "photo-like-400-2-1.png"]
    assert "| concurrent | 200 | 503 (with Retry-After) |" in capsys.readouterr().out
