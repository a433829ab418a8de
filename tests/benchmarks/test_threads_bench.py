"""benchmarks/threads.py: each policy in a worker subprocess of its own (its environment set before torch), the
workers taking turns idle and beside a busy loop, every figure of the table and the JSON there (a micro model,
one image per turn, here)."""
from __future__ import annotations

import json

import pytest

from benchmarks import threads as bench
from benchmarks.threads import candidate
from stylevar.utils.threads import CpuBudget

pytestmark = pytest.mark.slow  # worker subprocesses; the fast lane (-m "not slow") leaves this file out


def test_policy_names_resolve_over_the_cpus():
    budget = CpuBudget(4)
    assert (candidate("available", budget).threads, candidate("available", budget).passive) == (4, False)
    assert (candidate("spare-one+passive", budget).threads, candidate("spare-one+passive", budget).passive) == (3, True)
    assert candidate("torch", budget).threads == "torch" and candidate("3", budget).threads == 3
    env = candidate("one+passive", budget).environment({"OMP_NUM_THREADS": "8", "GOMP_SPINCOUNT": "1", "PATH": "p",
                                                         "STYLEVAR_THREADS": "2"})
    assert env == {"PATH": "p", "OMP_WAIT_POLICY": "PASSIVE"}  # this shell's thread settings left out
    assert (candidate("peer:spare-one", budget).method, candidate("peer:spare-one", budget).threads) == ("peer", 3)
    assert candidate("served:one", budget).method == "served" and candidate("one", budget).method == "library"
    for bad in ("fast", "one+active", "0", "peer:one+passive", "peer:torch", "other:one"):
        with pytest.raises(ValueError):
            candidate(bad, budget)


def test_one_run_alternates_the_policies_under_each_load(micro_model_dir, tmp_path, capsys):
    out = tmp_path / "threads.json"
    assert bench.main(["--policies", "torch,one,2+passive", "--loads", "idle,busy", "--rounds", "2", "--per-turn", "1",
                       "--warmup", "0", "--size", "48", "--settle", "0.1", "--model", str(micro_model_dir),
                       "--out", str(out)]) == 0
    table = capsys.readouterr().out
    result = json.loads(out.read_text())
    policies = result["policies"]
    assert (policies["one"]["threads"], policies["one"]["omp_wait_policy"]) == (1, None)
    assert (policies["2+passive"]["threads"], policies["2+passive"]["omp_wait_policy"]) == (2, "PASSIVE")
    assert policies["one"]["result_size"] == {"48": [48, 48]}
    assert len(result["busy_loop_cpu_share"]["busy"]) == 2 and not result["busy_loop_cpu_share"]["idle"]
    assert len(result["rows"]) == 6
    for row in result["rows"]:
        assert row["images"] == 2 and 0 < row["p50_s"] <= row["p90_s"] and row["cpu_p50_s"] > 0
        assert row["reference"] == "one" and row["p90_over_reference"] > 0
        assert row["policy"] != "one" or row["p90_over_reference"] == 1.0
        assert f"| {row['load']} | 48 | {row['policy']} | {row['threads']} |" in table
