"""data_tools.pack: a triplet manifest re-encoded as JPEGs in one folder that travels (issue 62): every distinct image
once, the entries, ids and splits kept, a bad image leaving out its entry with a line, a size ceiling, no overwrite."""
from __future__ import annotations

import json

import pytest
from PIL import Image

from data_tools import pack
from data_tools.index import read_manifest
from data_tools.synth import SynthConfig, generate


@pytest.fixture
def manifest(tmp_path):
    return generate(SynthConfig(out=str(tmp_path / "synth"), count=6, size=32, seed=1, val_fraction=0.34))


def test_pack_keeps_entries_and_stores_each_image_once_as_jpeg(manifest, tmp_path):
    lines = [json.loads(x) for x in manifest.read_text().splitlines()]
    lines[1]["style"] = lines[0]["style"]  # a style shared by two triplets is packed once
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "pack"
    assert pack.main(["--manifest", str(manifest), "--out", str(out), "--quality", "85"]) == 0
    before, after = read_manifest(manifest), read_manifest(out / "manifest.jsonl")
    assert [(e.id, e.split) for e in after] == [(e.id, e.split) for e in before]
    assert after[1].style == after[0].style
    files = sorted((out / "images").iterdir())
    assert len(files) == 6 * 3 - 1
    summary = json.loads((out / "pack.json").read_text())
    assert summary["images"] == len(files) and summary["bytes"] == sum(f.stat().st_size for f in files)
    for e in after:
        with Image.open(out / e.target) as img:
            assert img.format == "JPEG" and img.size == (32, 32)


def test_a_broken_image_leaves_out_its_entry_and_a_pack_is_never_overwritten(manifest, tmp_path, capsys):
    first = read_manifest(manifest)[0]
    (manifest.parent / first.content).write_bytes(b"not an image")
    out = tmp_path / "pack"
    assert pack.main(["--manifest", str(manifest), "--out", str(out)]) == 0
    assert [e.id for e in read_manifest(out / "manifest.jsonl")] == [e.id for e in read_manifest(manifest)[1:]]
    assert json.loads((out / "pack.json").read_text())["left_out"][0]["id"] == first.id
    assert f"left out {first.id}" in capsys.readouterr().err
    assert pack.main(["--manifest", str(manifest), "--out", str(out)]) == 2
    assert "holds files already" in capsys.readouterr().err


def test_a_pack_past_its_ceiling_fails_with_its_size_and_leaves_nothing(manifest, tmp_path, capsys):
    assert pack.main(["--manifest", str(manifest), "--out", str(tmp_path / "p"), "--max-mib", "0.001"]) == 2
    assert "grew past --max-mib 0.001" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["synth"]


def test_roles_left_out_name_a_file_that_is_not_there(manifest, tmp_path, capsys):
    out = tmp_path / "pack"
    assert pack.main(["--manifest", str(manifest), "--out", str(out), "--roles", "style,target"]) == 0
    entries = read_manifest(out / "manifest.jsonl")
    assert {e.content for e in entries} == {"not-packed/content"} and not (out / "not-packed").exists()
    assert len(list((out / "images").iterdir())) == 2 * len(entries)
    assert pack.main(["--manifest", str(manifest), "--out", str(tmp_path / "p2"), "--roles", "style,colour"]) == 2
    assert "roles must be among" in capsys.readouterr().err
