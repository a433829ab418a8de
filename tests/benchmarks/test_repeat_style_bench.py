"""benchmarks/repeat_style.py: the same style sent twice to a service with the condition cache and to one without,
every answer compared pixel for pixel (a micro model, one pair, small pictures)."""
from __future__ import annotations

import json

import pytest

from benchmarks import repeat_style as bench

pytestmark = pytest.mark.slow  # two services as subprocesses


def test_the_cached_service_answers_what_the_uncached_one_does(micro_model_dir, tmp_path, capsys):
    out = tmp_path / "repeat.json"
    assert bench.main(["--size", "48", "--pairs", "1", "--sweep", "2", "--model", str(micro_model_dir),
                       "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["identical"] == report["compared"] == 4  # first, two sweep seeds, a new content
    assert [len(report["times"]["cached"][s]) for s in bench.STEPS] == [1, 2, 1]
    assert any('kind="style"' in line and not line.rstrip().endswith(" 0.0") for line in report["cache_hits"])
    table = capsys.readouterr().out
    assert "| seed sweep | 2 |" in table and "4 of 4" in table


def test_more_pairs_than_pictures_are_refused():
    with pytest.raises(SystemExit):
        bench.main(["--pairs", "50"])
