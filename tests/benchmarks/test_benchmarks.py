"""benchmarks/cpu_pipeline.py (stage by stage on the CPU) runs end to end on its reference-shaped configuration and
says how to get the reference when no checkout of it is importable; benchmarks/overload.py reports every figure;
every benchmark answers a mistyped option with the nearest."""
from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from benchmarks import cpu_pipeline
from benchmarks.cpu_pipeline import STAGES
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


def test_a_repeated_style_is_timed_with_and_without_the_condition_cache(micro_model_dir, capsys):
    rc = cpu_pipeline.main(["--batch-sizes", "2", "--repeats", "1", "--warmup", "0", "--agreement-seeds", "1",
                            "--repeat-style", "--model", str(micro_model_dir), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    stages = out["stages_ms_per_image"]["2"]
    assert set(stages) == {"plain", "fp32", "plain cached", "fp32 cached"}
    assert set(stages["fp32 cached"]) == {"condition", "total"} and set(stages["fp32"]) == set(STAGES)
    assert out["config"] == f"{micro_model_dir}; one style a batch"


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
    for module in ("benchmarks.cpu_pipeline", "benchmarks.train_step"):
        args = [sys.executable, "-m", module, "--batch-sizes", "1"] + (["--reference"] if "cpu" in module else [])
        r = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, (module, r.stderr)
        assert "github.com/Senfier-LiqiJing/StyleVAR" in r.stderr and "PYTHONPATH" in r.stderr


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


@pytest.mark.parametrize("module, typo, meant", [("cpu_pipeline", "--repeates", "--repeats"),
                                                  ("memory_table", "--micro-bach", "--micro-batch"),
                                                  ("overload", "--raet", "--rate"), ("threads", "--roudns", "--rounds"),
                                                  ("train_step", "--precisons", "--precisions")])
def test_a_mistyped_option_is_answered_with_the_nearest(module, typo, meant, capsys):
    """Every benchmark's command line is the project's Parser: one line, naming the option it meant."""
    main = importlib.import_module(f"benchmarks.{module}").main
    with pytest.raises(SystemExit) as e:
        main([typo, "3"])
    assert e.value.code == 2
    assert capsys.readouterr().err == (f"python -m benchmarks.{module}: error: unknown option '{typo}'; "
                                       f"did you mean '{meant}'?\n")
