"""The GPU run (benchmarks/device_run.py): its CPU dry run writes every stage's figures, a stage past its limit is
killed with everything it started, a failing stage is recorded and the run goes on, bad options are refused; the bf16
peak of a GPU is picked by its name."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import device_run

REPO = Path(__file__).resolve().parents[2]

DRY_RUN = ["--device", "cpu", "--preset", "tiny", "--batch-sizes", "1,2", "--requests", "3", "--serve-seconds", "1",
           "--compile-backend", "eager", "--repeats", "1", "--warmup", "0", "--train-batch", "2",
           "--budget-s", "1500"]  # the stages' limits are shares of the budget: generous on a loaded machine


def figures(out, stage: str) -> dict:
    record = json.loads((out / f"{stage}.json").read_text())
    assert record["status"] == "ok", (stage, record.get("error"))
    return record["figures"]


@pytest.mark.slow  # six child processes, each importing torch; the service started once: ~1-3 min
@pytest.mark.timeout(1600)
def test_the_cpu_dry_run_writes_every_stages_figures(tmp_path):
    out = tmp_path / "run"
    run = subprocess.run([sys.executable, "-m", "benchmarks.device_run", str(out), *DRY_RUN], cwd=REPO,
                         capture_output=True, text=True, timeout=1600)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((out / "device_run.json").read_text())
    assert list(summary["stages"]) == [name for name, _ in device_run.STAGES]
    assert json.loads(run.stdout) == {name: "ok" for name, _ in device_run.STAGES}
    assert "device_run: no GPU in use (device cpu); torch " in run.stderr  # the environment, printed
    env = figures(out, "environment")
    assert env["torch"] and env["device"] == "cpu" and "torch_cuda" in env
    gold = figures(out, "golden")
    assert gold["tf32"] is False and gold["tokens_equal"] and gold["within_1e-4"]
    assert set(gold["tokens"]) == {"content", "style", "target"}
    eager, compiled = figures(out, "generate_eager"), figures(out, "generate_compiled")
    assert [r["batch"] for r in eager["generate"]] == [1, 2] and eager["generate"][0]["ms_per_image"] > 0
    assert eager["dynamo"]["graphs"] == 0 and not eager["compile"]
    assert compiled["compile"] and compiled["compile_backend"] == "eager" and compiled["dynamo"]["graphs"] > 0
    assert compiled["dynamo"]["recompile_limit_hits"] >= 0 and "counters" in compiled["dynamo"]
    [step] = figures(out, "sft_step")["steps"]["bf16 batch 2"].values()
    assert step["ms_per_step"] > 0
    served = figures(out, "service")
    assert served["clients"] == 3 and served["load"]["requests"] >= 3
    assert served["load"]["status_counts"] == {"200": served["load"]["requests"]}
    assert served["load"]["p99_ms"] >= served["load"]["p50_ms"] > 0
    assert served["memory_ready"]["host_peak_rss_mib"] > 0 and served["memory_ready"]["gpu_mib"] is None


def stops_running(pid: int, within_s: float = 120.0) -> bool:
    """Whether ``pid`` stops running within ``within_s``: a SIGKILL lands when the kernel next schedules its
    target, and a busy machine may take a while; a killed process that nobody has reaped yet (its parent died with
    it, and the init of a container may be slow to reap orphans) is a zombie, no longer running."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_a_stage_past_its_limit_is_killed_with_what_it_started(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    script = f"sleep 300 & echo $! > {pid_file}; wait"
    assert device_run.run_bounded(["bash", "-c", script], 5.0, tmp_path / "log") == "timed_out"
    pid = int(pid_file.read_text())
    assert stops_running(pid)  # the grandchild went with its session
    assert device_run.run_bounded(["bash", "-c", "exit 3"], 60.0, tmp_path / "log") == "exited"


@pytest.mark.slow  # one child importing torch
def test_a_failing_stage_is_recorded_and_the_run_goes_on(tmp_path):
    """On a machine without CUDA, `--device cuda`: the environment stage fails with torch's error, the golden stage
    runs after it (and fails too), the summary has both, the exit status says so."""
    out = tmp_path / "run"
    rc = device_run.main([str(out), "--stages", "environment,golden", "--budget-s", "600"])
    assert rc == 1
    stages = json.loads((out / "device_run.json").read_text())["stages"]
    assert [s["status"] for s in stages.values()] == ["failed", "failed"]
    assert stages["environment"]["error"] and stages["environment"]["limit_s"] > 0


@pytest.mark.parametrize("bad", [["--batch-sizes", "0"], ["--batch-sizes", "a"], ["--stages", "nope"],
                                 ["--budget-s", "3"], ["--requests", "0"]])
def test_bad_options_are_refused(bad, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        device_run.parse_args([str(tmp_path), *bad])
    assert e.value.code == 2 and "device_run" in capsys.readouterr().err


def test_a_stage_gets_its_share_and_never_more_than_is_left():
    assert device_run.stage_limit(0.1, 480.0, 480.0) == pytest.approx(48.0)
    assert device_run.stage_limit(1.0, 480.0, 100.0) == pytest.approx(100.0 - device_run.SUMMARY_RESERVE_S)


@pytest.mark.parametrize(("name", "peak"), [("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0),
                                            ("NVIDIA H200", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0),
                                            ("NVIDIA L4", 121.0), ("NVIDIA L40S", 362.0), ("Tesla T4", None)])
def test_the_peak_is_picked_by_the_gpus_name(name, peak):
    assert device_run.peak_tflops(name) == peak
