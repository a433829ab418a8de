"""`stylevar stylize` with several styles, masks, guidance, samples and formats, and over a folder or glob of
content images."""
from __future__ import annotations

import argparse

import numpy as np
import pytest
from PIL import Image

from stylevar import cli
from stylevar.pipelines.pipeline import StyleMix, StylePipeline

pytestmark = pytest.mark.slow  # the fast lane (-m "not slow") leaves this file out


@pytest.fixture
def inputs(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    rng = np.random.default_rng(0)
    for name, size in (("a.png", (40, 30)), ("b.jpg", (30, 30)), ("a.webp", (20, 36))):
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(d / name)
    (d / "notes.txt").write_text("not a picture")
    (d / "torn.png").write_bytes((d / "a.png").read_bytes()[:120])
    s = tmp_path / "styles"
    s.mkdir()
    Image.new("RGB", (32, 32), (200, 40, 40)).save(s / "red.png")
    Image.new("RGB", (32, 32), (40, 40, 200)).save(s / "blue.png")
    Image.new("L", (10, 10), 255).save(s / "white.png")
    half = Image.new("L", (10, 10), 0)
    half.paste(255, (0, 0, 5, 10))
    half.save(s / "half.png")
    return d, s


def test_a_folder_goes_to_a_folder_skipping_and_listing_unreadable_files(micro_model_dir, inputs, tmp_path, capsys):
    d, s = inputs
    out = tmp_path / "out"
    rc = cli.main(["stylize", str(d), str(s / "red.png"), "--style", str(s / "blue.png"), "--style-weights", "3,1",
                   "--mask", str(s / "half.png"), "--mask", str(s / "white.png"), "--guidance", "1",
                   "-o", str(out), "--model", str(micro_model_dir), "--batch-size", "2", "--format", "webp"])
    assert rc == cli.EXIT_PARTIAL == 1  # some inputs skipped: not a success
    err = capsys.readouterr().err
    assert "skipped 2 unreadable file(s):" in err and "notes.txt" in err and "torn.png" in err
    names = sorted(p.name for p in out.iterdir())
    assert names == ["a.webp", "a_webp.webp", "b.webp"], names
    with Image.open(out / "a.webp") as im:
        assert im.format == "WEBP" and im.size == (40, 30)


def test_a_glob_with_several_samples_names_each_by_its_seed(micro_model_dir, inputs, tmp_path):
    d, s = inputs
    out = tmp_path / "samples"
    rc = cli.main(["stylize", str(d / "*.png"), "--style", str(s / "red.png"), "-o", str(out), "--seed", "5",
                   "--num-samples", "2", "--model", str(micro_model_dir)])
    assert rc == cli.EXIT_PARTIAL  # torn.png is skipped, a.png is written
    assert sorted(p.name for p in out.iterdir()) == ["a-seed-5.png", "a-seed-6.png"]


def test_one_file_matches_the_python_api(micro_model_dir, inputs, tmp_path):
    d, s = inputs
    out = tmp_path / "o.png"
    rc = cli.main(["stylize", str(d / "a.png"), str(s / "red.png"), "--style", str(s / "blue.png"),
                   "--style-weights", "0.25,0.75", "--guidance", "0.5", "--seed", "3", "--max-size", "64",
                   "-o", str(out), "--model", str(micro_model_dir)])
    assert rc == 0
    pipe = StylePipeline.from_pretrained(micro_model_dir, device="cpu")
    mix = StyleMix((Image.open(s / "red.png").convert("RGB"), Image.open(s / "blue.png").convert("RGB")), (0.25, 0.75))
    ours = pipe(Image.open(d / "a.png").convert("RGB"), mix, seed=3, guidance=0.5, max_side=64)
    assert np.array_equal(np.asarray(Image.open(out)), np.asarray(ours))


@pytest.mark.parametrize("extra, message", [
    (["--style-weights", "1"], "style_weights: 1 weights for 2 style images"),
    (["--style-weights", "1,-1"], "weights must be finite numbers >= 0"),
    (["--style-weights", "1e39,1"], "weights must be finite numbers >= 0"),
    (["--mask", "{s}/white.png"], "style_masks: 1 masks for 2 style images"),
    (["--mask", "{s}/white.png", "--mask", "{d}/torn.png"], "mask 2 image"),
    (["--guidance", "-1"], "argument --guidance: must be in [0, 10]"),
    (["--format", "jpeg"], "--format jpeg but the output"),
    (["--style", "{s}/red.png"] * 3, "give 1 to 4 style images, got 5"),
])
def test_bad_mix_arguments_are_one_line_before_the_model(inputs, tmp_path, capsys, extra, message):
    d, s = inputs
    args = ["stylize", str(d / "a.png"), str(s / "red.png"), "--style", str(s / "blue.png"),
            *[e.format(s=s, d=d) for e in extra], "-o", str(tmp_path / "o.png"), "--model", str(tmp_path / "nomodel")]
    with pytest.raises(SystemExit) if "argument" in message or "weights must" in message else _nothing():
        assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "o.png").exists()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_every_stylize_argument_has_help():
    parser = cli.build_parser(["stylize"])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["stylize"]
    missing = [a.dest for a in sub._actions if not a.help]
    assert not missing, missing


def test_a_failed_write_leaves_nothing_partial(micro_model_dir, inputs, tmp_path, capsys,
                                                                           monkeypatch):
    import errno

    d, s = inputs
    out = tmp_path / "full"
    real_save = Image.Image.save
    calls = []

    def save(self, fp, *args, **kwargs):  # the second image meets a full disk half-way through
        calls.append(fp)
        if len(calls) == 2:
            with open(fp, "wb") as f:
                f.write(b"half an image")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(self, fp, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "save", save)
    rc = cli.main(["stylize", str(d), str(s / "red.png"), "-o", str(out), "--model", str(micro_model_dir),
                   "--batch-size", "1"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "1 image(s) written before it are complete" in err
    assert [p.name for p in out.iterdir()] == ["a.png"]  # no 0-byte or half-written file
