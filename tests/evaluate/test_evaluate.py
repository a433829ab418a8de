"""`stylevar evaluate` end to end on a synthetic manifest, a micro model directory and AdaIN stand-ins."""
from __future__ import annotations

import csv
import json
import math
import sys

import pytest
from PIL import Image

from stylevar.cli import main
from tests.conftest import use_weight_cache
from tests.baselines.test_adain import DECODER_CONVS, VGG_NORMALISED_CONVS, write_standin
from tests.metrics.test_metrics import write_torchvision
from stylevar.utils.extras import install_line

SIZE = 64  # evaluation resolution in these tests (the paper's 256 makes VGG slow on CPU)


def _image(path, kind: int, size: int = 48) -> None:
    """A small deterministic RGB picture (gradients and stripes), no RNG."""
    px = []
    for y in range(size):
        for x in range(size):
            u, v = x / (size - 1), y / (size - 1)
            stripe = 1.0 if int((u + v * kind) * 6) % 2 else 0.3
            px.append(tuple(int(255 * c) for c in ((u * stripe) % 1, (v + 0.1 * kind) % 1, (0.5 + 0.5 * math.sin(6 * u + kind)))))
    img = Image.new("RGB", (size, size))
    img.putdata(px)
    img.save(path)


def _manifest(root, rows: int, paired: bool):
    root.mkdir(parents=True)
    lines = []
    for i in range(rows):
        d = {"content": f"c{i}.png", "style": f"s{i}.png", "split": "val", "id": f"row{i}"}
        _image(root / d["content"], i)
        _image(root / d["style"], i + 7)
        if paired:
            d["target"] = f"t{i}.png"
            _image(root / d["target"], i + 3)
        lines.append(json.dumps(d))
    lines.append(json.dumps({"content": "c0.png", "style": "s0.png", **({"target": "t0.png"} if paired else {}),
                             "split": "train"}))  # not drawn: --split val
    (root / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    return root / "manifest.jsonl"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    return {"paired": _manifest(root / "paired", 3, True), "unpaired": _manifest(root / "unpaired", 2, False)}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """VGG-19, VGG-16 and both AdaIN files as stand-ins; no DreamSim, no CLIP."""
    root = tmp_path_factory.mktemp("weights")
    with pytest.MonkeyPatch.context() as mp:
        sv, th = use_weight_cache(mp, root)
        write_torchvision(th, "vgg19", seed=10)
        write_torchvision(th, "vgg16", seed=11)
        sv.mkdir()
        write_standin(sv / "vgg_normalised.pth", VGG_NORMALISED_CONVS, 1, gain=1.5)
        write_standin(sv / "decoder.pth", DECODER_CONVS, 2)
        yield root


def _args(data, model_dir, out, *extra):
    return ["evaluate", "--method", str(model_dir), "--method", "adain", "--method", "adain-paper",
            "--benchmark", f"paired={data['paired']}", "--benchmark", f"unpaired={data['unpaired'].parent}",
            "--n", "2", "--seed", "7", "--image-size", str(SIZE), "--batch-size", "2", "--out", str(out), "--quiet",
            "--no-warmup", *extra]


def test_without_weights_exits_with_the_documented_message(data, micro_model_dir, weight_homes, tmp_path, capsys):
    rc = main(_args(data, micro_model_dir, tmp_path / "out"))
    err = capsys.readouterr().err
    assert rc == 3
    assert "missing weights:" in err
    assert "vgg19 (vgg19-dcbb9e9d.pth), needed by style_loss, content_loss, AdaIN (paper eval)" in err
    assert "adain_decoder (decoder.pth), needed by AdaIN, AdaIN (paper eval)" in err
    assert "stylevar weights fetch vgg19 vgg16 dreamsim clip" in err
    assert ("or compare with a method that needs no download instead of AdaIN, AdaIN (paper eval): --method magenta"
            in err)
    assert "--allow-missing" in err
    assert not (tmp_path / "out").exists()  # nothing ran


@pytest.mark.slow
def test_allow_missing_writes_every_output(data, micro_model_dir, cache, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_args(data, micro_model_dir, out, "--allow-missing")) == 0
    stdout = capsys.readouterr().out
    expected = {"results.csv", "results.md", "per_sample.jsonl", "samples_paired.png", "samples_unpaired.png",
                *(f"chart_{m}.png" for m in ("style_loss", "content_loss", "lpips", "ssim", "seconds_per_image"))}
    assert expected <= {p.name for p in out.iterdir()}
    assert not (out / "chart_dreamsim.png").exists() and not (out / "chart_clip.png").exists()

    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [(r["benchmark"], r["method"]) for r in rows] == [
        (b, m) for b in ("paired", "unpaired") for m in ("random-init", "AdaIN", "AdaIN (paper eval)")]
    for r in rows:
        assert r["dreamsim"] == r["clip"] == "missing"
        assert float(r["ssim"]) <= 1 and float(r["style_loss"]) >= 0 and float(r["seconds_per_image"]) > 0
        assert r["n"] == "2" and r["paired"] == str(r["benchmark"] == "paired")

    md = (out / "results.md").read_text()
    assert md in stdout + "\n" or md.strip() in stdout
    header = next(line for line in md.splitlines() if line.startswith("| Benchmark"))
    assert "Style Loss ↓" in header and "SSIM ↑" in header and "CLIP Sim. ↑" in header and "Time (s) ↓" in header
    body = [line for line in md.splitlines() if line.startswith("| paired") or line.startswith("| unpaired")]
    assert len(body) == 6 and all("| missing |" in line for line in body)
    assert sum("**" in line for line in body) >= 2  # a best value per benchmark
    assert "weight `dreamsim` not present" in md and "weight `clip` not present" in md

    samples = [json.loads(line) for line in open(out / "per_sample.jsonl")]
    assert len(samples) == 2 * 3 + 2 * 3
    assert {s["id"] for s in samples if s["benchmark"] == "paired"} <= {"row0", "row1", "row2"}
    assert all(s["dreamsim"] == "missing" for s in samples)
    assert all(s["target"] is None for s in samples if s["benchmark"] == "unpaired")

    grid = Image.open(out / "samples_paired.png")
    cell, pad, header_h = 160, 4, 28
    assert grid.size == (6 * (cell + pad) + pad, header_h + 2 * (cell + pad) + pad)  # content|style|target|3 methods


def test_allow_missing_says_why_the_table_is_shorter_than_asked(data, weight_homes, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["evaluate", "--method", "reinhard", "--method", "adain", "--benchmark", f"paired={data['paired']}",
                 "--n", "5", "--metrics", "ssim", "--image-size", str(SIZE), "--out", str(out), "--quiet",
                 "--no-warmup", "--allow-missing"]) == 0
    err = capsys.readouterr().err
    drawn = f"paired: 3 of 5 rows: 2 pairs not drawn because split `val` of {data['paired']} has only 3 (--split all)"
    methods = "1 of 2 benchmark x method rows: AdaIN not run because weights adain_decoder, adain_vgg are missing"
    assert f"note: {drawn}\n" in err and f"note: {methods}\n" in err
    md = (out / "results.md").read_text()
    assert f"- {drawn}." in md and f"- {methods}." in md


@pytest.mark.slow
def test_same_seed_same_numbers(data, micro_model_dir, cache, tmp_path):
    def run(out):
        args = ["evaluate", "--method", str(micro_model_dir), "--method", "adain", "--benchmark",
                f"paired={data['paired']}", "--n", "2", "--seed", "3", "--image-size", str(SIZE),
                "--metrics", "ssim", "content_loss", "--out", str(out), "--quiet", "--no-warmup"]
        assert main(args) == 0
        return [{k: v for k, v in json.loads(line).items() if k != "seconds_per_image"} for line in open(out / "per_sample.jsonl")]

    assert run(tmp_path / "a") == run(tmp_path / "b")


def test_a_missing_metrics_extra_is_one_line_before_any_work(data, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `pip install -e '.[app]'` has no matplotlib
    out = tmp_path / "o"
    assert main(["evaluate", "--method", "reinhard", "--benchmark", f"p={data['paired']}", "--out", str(out)]) == 2
    assert capsys.readouterr().err == ("stylevar evaluate: error: evaluation needs the metrics extra (matplotlib "
                                       f"not installed): {install_line('metrics')}\n")
    assert not out.exists()


def test_bad_arguments(data, micro_model_dir, cache, tmp_path, capsys):
    assert main(["evaluate", "--method", str(tmp_path / "nope"), "--benchmark", f"p={data['paired']}",
                 "--out", str(tmp_path / "o")]) == 2
    assert "neither one of adain, adain-paper, reinhard, magenta nor a model directory" in capsys.readouterr().err
    assert main(["evaluate", "--method", "magneta", "--benchmark", f"p={data['paired']}", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.rstrip().endswith("[:grpo|sft]); did you mean 'magenta'?")
    assert main(["evaluate", "--method", "reinhard", "--benchmark", f"p={tmp_path}", "--out", str(tmp_path / "o")]) == 2
    assert "has no manifest.jsonl" in capsys.readouterr().err
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("a.png", "b.png", "t.png"):
        _image(mixed / name, 1)
    (mixed / "manifest.jsonl").write_text(
        json.dumps({"content": "a.png", "style": "b.png", "target": "t.png", "split": "val"}) + "\n"
        + json.dumps({"content": "a.png", "style": "b.png", "split": "val"}) + "\n")
    assert main(["evaluate", "--method", "reinhard", "--benchmark", f"m={mixed}", "--out", str(tmp_path / "o")]) == 2
    assert "all paired or all unpaired" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["evaluate", "--method", "reinhard", "--benchmark", "no-equals-sign", "--out", str(tmp_path / "o")])


def test_a_model_is_timed_with_every_sample_computed_whole(micro_model_dir):
    """The baselines keep nothing from one sample to the next: a StyleVAR method runs with its condition cache off,
    so no content or style is encoded once for several samples (or by the warm-up call) and its seconds compare."""
    import torch

    from stylevar.evaluate.methods import make_method

    method = make_method(str(micro_model_dir))
    method.load(torch.device("cpu"))
    content, style = torch.rand(2, 3, 32, 32), torch.rand(2, 3, 32, 32)
    assert method(content, style, [0, 1]).shape == content.shape
    assert not method.pipe.conditions.enabled and method.pipe.conditions.stats().entries == 0
