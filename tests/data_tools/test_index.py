"""Manifests from dataset layouts: matching, seeded splits, bad files left out and reported."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from data_tools import index
from data_tools.index import IndexConfig, assign_splits, build_index, read_manifest


def _img(path: Path, seed: int, fmt: str = "PNG") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.random.default_rng(seed).integers(0, 256, (20, 24, 3), dtype=np.uint8)
    Image.fromarray(arr).save(path, format=fmt)
    return path


def _corrupt(path: Path, seed: int) -> Path:
    """A PNG cut in half: the header opens, the pixels do not decode."""
    _img(path, seed)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _text(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not an image\n")
    return path


def _report(manifest: Path) -> dict:
    return json.loads(manifest.with_name(manifest.name + ".report.json").read_text())


@pytest.fixture
def omnistyle(tmp_path) -> Path:
    root = tmp_path / "omni"
    for i in range(4):
        _img(root / "content" / f"c{i}.png", i)
        _img(root / "style" / f"s{i}.jpg", 10 + i, "JPEG")
    _img(root / "content" / "c.v2.png", 50)  # a dot in the stem
    _text(root / "content" / "notes.txt")  # not an image
    _corrupt(root / "style" / "broken.png", 60)
    _img(root / "style" / "s&&x.png", 70)  # separator inside a style stem
    for i in range(4):
        _img(root / "target" / f"c{i}&&s{i}.png", 20 + i)
    _img(root / "target" / "c.v2&&s1.png", 30)
    _img(root / "target" / "c0&&s&&x.png", 31)
    _img(root / "target" / "c1&&broken.png", 32)  # its style is corrupt
    _img(root / "target" / "c9&&s1.png", 33)  # no such content
    _corrupt(root / "target" / "c2&&s3.png", 34)  # corrupt target
    _text(root / "target" / "README.md")  # no separator, not an image
    _img(root / "target" / "c3&&s0.png", 35)
    _img(root / "target" / "c3&&s0.jpg", 36, "JPEG")  # two targets for one pair: ambiguous
    (root / "target" / ".DS_Store").write_bytes(b"\x00\x01")  # hidden: ignored
    return root


def test_omnistyle_index(omnistyle, tmp_path):
    out = tmp_path / "m" / "omni.jsonl"
    report = build_index(IndexConfig("omnistyle", str(omnistyle), str(out), workers=2))
    entries = read_manifest(out)
    assert sorted(e.id for e in entries) == sorted(["c0&&s0", "c1&&s1", "c2&&s2", "c3&&s3", "c.v2&&s1", "c0&&s&&x"])
    by_id = {e.id: e for e in entries}
    assert by_id["c.v2&&s1"].content == "../omni/content/c.v2.png"
    assert by_id["c0&&s&&x"].style == "../omni/style/s&&x.png"
    for e in entries:  # paths are relative to the manifest's folder
        for rel in (e.content, e.style, e.target):
            assert (out.parent / rel).is_file()
        assert Path(e.content).stem + "&&" + Path(e.style).stem == Path(e.target).stem
    bad = {Path(b["path"]).name: b["code"] for b in report["bad_files"]}
    assert bad == {"notes.txt": "not_an_image", "broken.png": "corrupt_image",
                   "c2&&s3.png": "corrupt_image", "README.md": "not_an_image"}
    skipped = {s["item"] for s in report["skipped"]}
    assert {"c1&&broken.png", "c9&&s1.png", "c2&&s3.png", "README.md", "c3&&s0.png", "c3&&s0.jpg"} <= skipped
    assert report["counts"]["entries"] == 6 and report["counts"]["bad_files"] == 4
    assert _report(out) == report


def test_omnistyle_index_is_seeded(omnistyle, tmp_path):
    a = build_index(IndexConfig("omnistyle", str(omnistyle), str(tmp_path / "a.jsonl"), seed=1, val_fraction=0.5))
    b = build_index(IndexConfig("omnistyle", str(omnistyle), str(tmp_path / "b.jsonl"), seed=1, val_fraction=0.5))
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert a["counts"]["val"] == 3 and a["counts"]["train"] == 3 == b["counts"]["train"]


def test_imagepulse_index(tmp_path):
    root = tmp_path / "pulse"
    for i in range(3):
        for j, role in enumerate(("content", "style", "target")):
            _img(root / f"{i:04d}" / f"{role}.png", 3 * i + j)
    _img(root / "0100" / "content.png", 1)
    _img(root / "0100" / "style.png", 2)  # no target
    _img(root / "0101" / "content.png", 3)
    _img(root / "0101" / "style.png", 4)
    _corrupt(root / "0101" / "target.png", 5)
    _img(root / "0102" / "content.png", 6)
    _text(root / "0102" / "style.png")  # a text file named like an image
    _img(root / "0102" / "target.png", 7)
    _text(root / "index.txt")
    out = tmp_path / "pulse.jsonl"
    assert index.main(["--layout", "imagepulse", "--root", str(root), "--out", str(out), "--workers", "2"]) == 0
    entries = read_manifest(out)
    assert sorted(e.id for e in entries) == ["0000", "0001", "0002"]
    assert all(e.target == f"pulse/{e.id}/target.png" for e in entries)
    report = _report(out)
    assert {Path(b["path"]).parent.name + "/" + Path(b["path"]).name: b["code"] for b in report["bad_files"]} == {
        "0101/target.png": "corrupt_image", "0102/style.png": "not_an_image"}
    assert {s["item"] for s in report["skipped"]} == {"0100", "0101", "0102"}


def test_pairs_index(tmp_path):
    contents, styles = tmp_path / "coco", tmp_path / "wikiart"
    for i in range(4):
        _img(contents / f"{i:012d}.jpg", i, "JPEG")
    _corrupt(contents / "000000000099.png", 9)
    _text(contents / "LICENSE")  # no image suffix: not listed
    _img(styles / "Impressionism" / "a.jpg", 10, "JPEG")
    _img(styles / "Cubism" / "b.png", 11)
    _img(styles / "Cubism" / "c.png", 12)
    out = tmp_path / "pairs.jsonl"
    cfg = IndexConfig("pairs", str(contents), str(out), styles=str(styles), count=7, workers=2, seed=5)
    report = build_index(cfg)
    entries = read_manifest(out)
    assert len(entries) == 7
    assert all(e.target is None and e.split == "val" for e in entries)
    assert "target" not in json.loads(out.read_text().splitlines()[0])
    assert all("000000000099" not in e.content for e in entries)
    used_contents = [e.content for e in entries]
    assert len(set(used_contents)) == 4  # every valid content used before any repeats
    assert len({e.style for e in entries}) == 3
    assert [Path(b["path"]).name for b in report["bad_files"]] == ["000000000099.png"]
    again = tmp_path / "again.jsonl"
    build_index(IndexConfig("pairs", str(contents), str(again), styles=str(styles), count=7, workers=1, seed=5))
    assert again.read_bytes() == out.read_bytes()


def test_pairs_need_styles(tmp_path):
    with pytest.raises(ValueError, match="--styles"):
        IndexConfig("pairs", str(tmp_path), str(tmp_path / "m.jsonl"))


def test_missing_root_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        build_index(IndexConfig("omnistyle", str(tmp_path / "nowhere"), str(tmp_path / "m.jsonl")))
    with pytest.raises(SystemExit):
        index.main(["--layout", "imagepulse", "--root", str(tmp_path / "nowhere"), "--out", str(tmp_path / "m.jsonl")])


def test_assign_splits():
    s = assign_splits(100, 0.05, seed=42)
    assert s.count("val") == 5 and s == assign_splits(100, 0.05, seed=42)
    assert s != assign_splits(100, 0.05, seed=43)
    assert assign_splits(10, 0.05, seed=0).count("val") == 1  # at least one when asked for some
    assert assign_splits(10, 0.0, seed=0).count("val") == 0
    assert assign_splits(1, 0.05, seed=0) == ["train"]
    with pytest.raises(ValueError):
        assign_splits(10, -0.1, seed=0)


def test_read_manifest_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        read_manifest(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"content": "a.png", "style": "b.png", "split": "train"}\n{"content": "a.png"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        read_manifest(bad)
    bad.write_text('{"content": "a.png", "style": "b.png", "split": "test"}\n')
    with pytest.raises(ValueError, match="split"):
        read_manifest(bad)
