"""Training datasets: manifests and shards give the same items; bad data is skipped and reported."""
from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from data_tools.index import ManifestEntry, read_manifest, write_manifest
from data_tools.shards import ShardConfig, write_shards
from data_tools.synth import SynthConfig, generate
from training.parts.data import (
    AugmentConfig,
    ShardTripletDataset,
    TripletDataset,
    collate_triplets,
    open_triplets,
)
from training.parts.streams import LoaderPolicy

S = 32


@pytest.fixture(scope="module")
def synth_manifest(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth")
    return generate(SynthConfig(out=str(out), count=14, size=40, seed=4, val_fraction=0.25))


@pytest.fixture(scope="module")
def shard_dir(synth_manifest, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    write_shards(ShardConfig(str(synth_manifest), str(out), shard_size=4, workers=2))
    return out


def _assert_same_items(a: dict, b: dict) -> None:
    assert a["id"] == b["id"] and a["index"] == b["index"]
    assert set(a) == set(b)
    for role in ("content", "style", "target"):
        assert torch.equal(a[role], b[role]), role


def test_items_are_tensors_in_range(synth_manifest):
    ds = TripletDataset(synth_manifest, "train", S)
    assert len(ds) == 10  # 14 minus round(14 * 0.25) = 4 val
    item = ds[0]
    for role in ("content", "style", "target"):
        x = item[role]
        assert x.shape == (3, S, S) and x.dtype == torch.float32
        assert -1.0 <= x.min() < x.max() <= 1.0
    assert item["skipped"] == [] and item["index"] == 0


def test_shards_layout_and_summary(shard_dir):
    summary = json.loads((shard_dir / "shards.json").read_text())
    assert summary["splits"]["train"] == {"count": 10, "shards": [f"train-{i:06d}.tar" for i in range(3)]}
    assert summary["splits"]["val"] == {"count": 4, "shards": ["val-000000.tar"]}
    assert summary["skipped"] == []


@pytest.mark.parametrize("split", ["train", "val"])
def test_shards_round_trip(synth_manifest, shard_dir, split):
    from_manifest = open_triplets([str(synth_manifest)], split, S)
    from_shards = open_triplets([str(shard_dir)], split, S)
    assert isinstance(from_manifest, TripletDataset) and isinstance(from_shards, ShardTripletDataset)
    items = list(from_shards)
    assert len(items) == len(from_manifest) == from_shards.num_samples
    for item in items:
        _assert_same_items(from_manifest[item["index"]], item)


def test_augmentations_match_across_readers(synth_manifest, shard_dir):
    aug = AugmentConfig()
    a = open_triplets(str(synth_manifest), "train", S, aug, seed=3)
    b = open_triplets(str(shard_dir / "train-{000000..000002}.tar"), "train", S, aug, seed=3)
    a.set_epoch(2)
    b.set_epoch(2)
    for item in b:
        _assert_same_items(a[item["index"]], item)


def test_shards_are_byte_identical(synth_manifest, shard_dir, tmp_path):
    write_shards(ShardConfig(str(synth_manifest), str(tmp_path), shard_size=4))
    for p in sorted(shard_dir.glob("*.tar")):
        assert (tmp_path / p.name).read_bytes() == p.read_bytes()


def test_shards_refuse_to_overwrite(synth_manifest, shard_dir):
    with pytest.raises(FileExistsError, match="--overwrite"):
        write_shards(ShardConfig(str(synth_manifest), str(shard_dir), shard_size=4))


def test_shard_reader_with_dataloader_workers(shard_dir):
    ds = open_triplets(str(shard_dir), "train", S)
    loader = DataLoader(ds, batch_size=3, collate_fn=collate_triplets, **LoaderPolicy(2).options(persistent=False))
    ids = [i for batch in loader for i in batch["id"]]
    assert sorted(ids) == sorted(e.id for e in read_manifest(Path(json.loads(
        (shard_dir / "shards.json").read_text())["manifest"])) if e.split == "train")


def test_augmentation_is_deterministic(synth_manifest):
    aug = AugmentConfig()
    a = TripletDataset(synth_manifest, "train", S, aug, seed=1)
    b = TripletDataset(synth_manifest, "train", S, aug, seed=1)
    plain = TripletDataset(synth_manifest, "train", S)
    _assert_same_items(a[3], b[3])
    assert not torch.equal(a[3]["content"], plain[3]["content"])
    assert not torch.equal(a[3]["style"], plain[3]["style"])
    first = a[3]
    a.set_epoch(1)
    assert not torch.equal(first["content"], a[3]["content"])
    a.set_epoch(0)
    _assert_same_items(first, a[3])
    off = TripletDataset(synth_manifest, "train", S, AugmentConfig(enabled=False), seed=1)
    _assert_same_items(off[3], plain[3])


def test_rotation_is_shared_by_content_and_target(synth_manifest):
    # brightness off: content and target then go through the same geometric transform
    aug = AugmentConfig(content_brightness=0.0, content_max_degrees=20)
    ds = TripletDataset(synth_manifest, "train", S, aug, seed=0)
    plain = TripletDataset(synth_manifest, "train", S)
    unrotated = TripletDataset(synth_manifest, "train", S,
                               AugmentConfig(content_brightness=0.0, content_max_degrees=20, rotate_target=False), seed=0)
    item, ref, item_fixed = ds[0], plain[0], unrotated[0]
    assert not torch.equal(item["target"], ref["target"])
    assert torch.equal(item_fixed["target"], ref["target"])
    assert torch.equal(item_fixed["content"], item["content"])


def test_palette_permutation_reorders_the_style_and_the_target_together(synth_manifest):
    plain = TripletDataset(synth_manifest, "train", S)
    only = TripletDataset(synth_manifest, "train", S, AugmentConfig(geometry=False, palette_permute=True), seed=2)
    orders = set()
    for i in range(len(plain)):
        ref, item = plain[i], only[i]
        assert torch.equal(item["content"], ref["content"])  # the content keeps its colours and its crop
        order = next(o for o in itertools.permutations(range(3)) if torch.equal(item["style"], ref["style"][list(o)]))
        assert torch.equal(item["target"], ref["target"][list(order)])  # the target follows the style's order
        orders.add(order)
    assert len(orders) > 2  # several channel orders over the split, drawn per (seed, epoch, index)
    _assert_same_items(only[1], TripletDataset(synth_manifest, "train", S, only.transform.augment, seed=2)[1])
    # with the geometric augmentations, their draws are those of the plain augmented run, then the permutation
    geo = TripletDataset(synth_manifest, "train", S, AugmentConfig(), seed=1)[3]
    both = TripletDataset(synth_manifest, "train", S, AugmentConfig(palette_permute=True), seed=1)[3]
    assert torch.equal(both["content"], geo["content"])
    assert any(torch.equal(both["style"], geo["style"][list(o)]) for o in itertools.permutations(range(3)))


def test_bad_images_in_manifest_are_skipped_and_reported(synth_manifest, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(synth_manifest.parent, root)
    entries = [e for e in read_manifest(root / "manifest.jsonl") if e.split == "train"]
    (root / entries[1].target).unlink()  # missing file
    data = (root / entries[3].content).read_bytes()
    (root / entries[3].content).write_bytes(data[: len(data) // 2])  # truncated PNG
    manifest = write_manifest(entries, root / "train.jsonl")

    ds = TripletDataset(manifest, "train", S)
    clean = TripletDataset(synth_manifest, "train", S)
    with pytest.warns(RuntimeWarning, match=entries[1].target):
        item = ds[1]
    assert item["id"] == entries[2].id and item["index"] == 1  # the next valid entry
    assert item["skipped"] == [str(root / entries[1].target)]
    assert torch.equal(item["content"], clean[2]["content"])

    loader = DataLoader(ds, batch_size=4, shuffle=False, collate_fn=collate_triplets)
    with pytest.warns(RuntimeWarning, match=Path(entries[3].content).name):
        batches = list(loader)
    assert sum(len(b["id"]) for b in batches) == len(entries)  # batch sizes are kept
    reported = [p for b in batches for p in b["skipped"]]
    assert reported == [str(root / entries[1].target), str(root / entries[3].content)]
    assert set(ds.skipped) == set(reported)
    assert "not found" in ds.skipped[reported[0]] and "corrupt" in ds.skipped[reported[1]]


def test_all_bad_data_raises(tmp_path):
    entries = [ManifestEntry(f"c{i}.png", "s.png", "t.png", "train", str(i)) for i in range(3)]
    manifest = write_manifest(entries, tmp_path / "m.jsonl")
    ds = TripletDataset(manifest, "train", S)
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="unusable images"):
        ds[0]


def test_shard_writer_leaves_out_bad_entries(synth_manifest, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(synth_manifest.parent, root)
    entries = read_manifest(root / "manifest.jsonl")
    (root / entries[0].style).write_text("oops")
    summary = write_shards(ShardConfig(str(root / "manifest.jsonl"), str(tmp_path / "sh"), shard_size=100))
    assert [s["id"] for s in summary["skipped"]] == [entries[0].id]
    assert "not_an_image" in summary["skipped"][0]["reason"]
    n_split = sum(e.split == entries[0].split for e in entries)
    assert summary["splits"][entries[0].split]["count"] == n_split - 1


def test_corrupt_member_in_a_shard_is_skipped(shard_dir, tmp_path):
    import webdataset as wds

    good = list(wds.DataPipeline(wds.SimpleShardList([str(shard_dir / "val-000000.tar")]), wds.tarfile_to_samples()))
    bad = tmp_path / "val-000000.tar"
    with wds.TarWriter(str(bad)) as w:
        for i, s in enumerate(good):
            s = {k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
            if i == 1:
                s["style.png"] = s["style.png"][:40]
            w.write(s)
    ds = ShardTripletDataset([str(bad)], "val", S)
    with pytest.warns(RuntimeWarning, match="style.png"):
        items = list(ds)
    assert len(items) == len(good) - 1 and len(ds.skipped) == 1


def test_unpaired_manifest_has_no_target(synth_manifest, tmp_path):
    entries = [ManifestEntry(e.content, e.style, None, "val", e.id) for e in read_manifest(synth_manifest)][:3]
    manifest = write_manifest(entries, synth_manifest.parent / "pairs.jsonl")
    ds = open_triplets(str(manifest), "val", S)
    batch = collate_triplets([ds[0], ds[1], None])
    assert "target" not in batch and batch["content"].shape == (2, 3, S, S)
    with pytest.raises(ValueError, match="mixes"):
        collate_triplets([ds[0], TripletDataset(synth_manifest, "val", S)[0]])


def test_missing_manifest_is_a_clear_error(synth_manifest, tmp_path):
    missing = tmp_path / "nope" / "manifest.jsonl"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        TripletDataset([synth_manifest, missing], "train", S)
    with pytest.raises(FileNotFoundError, match="nope"):
        open_triplets([str(synth_manifest), str(missing)], "train", S)
    with pytest.raises(FileNotFoundError, match="no files match"):
        open_triplets(str(tmp_path / "train-{000000..000003}.tar"), "train", S)
    with pytest.raises(FileNotFoundError, match="neither manifest.jsonl"):
        open_triplets(str(tmp_path), "train", S)


def test_mixing_manifests_and_shards_is_refused(synth_manifest, shard_dir):
    with pytest.raises(ValueError, match="not both"):
        open_triplets([str(synth_manifest), str(shard_dir)], "train", S)


def test_empty_split_is_a_clear_error(tmp_path):
    manifest = write_manifest([ManifestEntry("a.png", "b.png", "c.png", "train", "0")], tmp_path / "m.jsonl")
    with pytest.raises(ValueError, match="'val'"):
        TripletDataset(manifest, "val", S)


def test_bad_augment_config_is_refused():
    with pytest.raises(ValueError, match="style_crop_scale"):
        AugmentConfig(style_crop_scale=(0.0, 1.0))
