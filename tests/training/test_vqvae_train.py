"""training.vqvae on a tiny tokenizer (16 px): training and logging, RUN/final loading, dead-code
restarts, LPIPS from (stand-in) local weights, input errors."""
from __future__ import annotations

import json

import pytest
import torch
import torchvision

from data_tools.synth import SynthConfig, generate
from stylevar.loaders.convert import load_vqvae
from stylevar.config import VQVAEConfig
from stylevar.models.tokenizer import MultiScaleVQVAE
from tests.training.test_loop import CPU1
from training.vqvae import __main__ as vqvae
from training.vqvae import objective as vqvae_objective
from training.parts.optim import make_adamw
from training.parts.log import read_log

TOK = dict(vocab_size=64, z_channels=8, ch=8, ch_mult=[1, 1, 2], num_res_blocks=1, patch_nums=[1, 2, 4],
           using_sa=False, using_mid_sa=False)  # 16 px


pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("vq")
    manifest = generate(SynthConfig(out=str(root / "data"), count=16, size=16, seed=2, val_fraction=0.25))
    preset = root / "preset.json"
    preset.write_text(json.dumps({"tokenizer": TOK}))
    return {"manifest": manifest, "preset": preset}


def test_vqvae_trains_logs_and_final_loads(data, tmp_path, capsys):
    out = tmp_path / "run"
    vqvae.main(["--data", str(data["manifest"]), "--preset", str(data["preset"]), "--out", str(out),
                "--max-steps", "12", "--batch-size", "6", "--lr", "3e-3", "--log-every", "3", "--val-every", "6",
                "--save-every", "6", "--restart-every", "3", "--dead-after", "3", "--no-progress"])
    log = read_log(out)
    train = [r for r in log if "loss" in r]
    assert [r["step"] for r in train] == [3, 6, 9, 12]
    assert all({"step", "loss", "lr", "l1", "l2", "vq_loss", "usage", "active", "restarted_total"} <= set(r)
               for r in train)
    assert train[-1]["loss"] < train[0]["loss"]
    assert train[-1]["restarted_total"] > 0  # 64 codes, few hit: restarts happened
    val = [r for r in log if "val_loss" in r]
    assert [r["step"] for r in val] == [6, 12] and all("val_psnr" in r for r in val)
    assert val[-1]["val_images"] == 3 * 4  # 4 val triplets, 3 distinct images each
    assert "LPIPS off" in capsys.readouterr().err

    cfg_json = json.loads((out / "final" / "config.json").read_text())
    cfg = VQVAEConfig.from_dict(cfg_json["tokenizer"])
    assert cfg == VQVAEConfig.from_dict(TOK)
    model = load_vqvae(out / "final" / "tokenizer.safetensors", cfg)
    state = torch.load(sorted((out / "checkpoints").glob("step-*.pt"))[-1], weights_only=True)["model"]
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[f"vqvae.{k}"]), k
    assert json.loads((out / "skipped.json").read_text())["count"] == 0


def test_dead_codes_restart_from_encoder_outputs():
    torch.manual_seed(0)
    model = MultiScaleVQVAE(VQVAEConfig.from_dict(TOK)).train()
    obj = vqvae_objective.VQVAEObjective(model, vqvae_objective.LossWeights())
    opt = make_adamw(model, 1e-3, 0.0)
    img = torch.rand(4, 3, 16, 16) * 2 - 1
    loss, _ = obj({"image": img})
    loss.backward()
    opt.step()
    restarter = vqvae_objective.DeadCodeRestarter(obj, opt, CPU1, every=1, dead_after=1, seed=0)
    hit = obj.hits_V > 0
    before = model.quantize.embedding.weight.detach().clone()
    out = restarter(1, {})
    after = model.quantize.embedding.weight.detach()
    assert out["restarted_total"] == float((~hit).sum()) > 0
    assert torch.equal(after[hit], before[hit]), "codes in use are kept"
    assert not torch.equal(after[~hit], before[~hit])
    with torch.no_grad():
        f = model.latent(img)
    pool = torch.cat([torch.nn.functional.interpolate(f, size=(p, p), mode="area").permute(0, 2, 3, 1).reshape(-1, 8)
                      for p in TOK["patch_nums"]])
    nearest = torch.cdist(after[~hit], pool).min(dim=1).values
    assert float(nearest.max()) < 0.05 * float(pool.std()) * 8, "new codes are (noisy) encoder outputs"
    emb_state = opt.state[model.quantize.embedding.weight]
    assert torch.all(emb_state["exp_avg"][~hit] == 0) and torch.all(emb_state["exp_avg_sq"][~hit] == 0)
    assert torch.all(restarter.since_hit_V == 0)
    saved = restarter.state_dict()
    other = vqvae_objective.DeadCodeRestarter(obj, opt, CPU1, every=1, dead_after=1, seed=0)
    other.load_state_dict(saved)
    assert other.restarted_total == restarter.restarted_total


def test_lpips_uses_local_vgg_weights(weight_homes):
    _, th = weight_homes
    model, note = vqvae_objective.build_lpips(torch.device("cpu"))
    assert model is None and "LPIPS off" in note and "vgg16" in note
    bad = th / "hub" / "checkpoints" / "vgg16-397923af.pth"
    bad.parent.mkdir(parents=True)
    torch.save({"features.0.weight": torch.zeros(3)}, bad)
    model, note = vqvae_objective.build_lpips(torch.device("cpu"))
    assert model is None and "not usable" in note and "WeightMismatchError" in note
    torch.manual_seed(0)
    # random weights in torchvision's VGG-16 layout; the classifier (not used by LPIPS) is stored as
    # broadcast zeros so that the file stays small
    with torch.device("meta"):
        layout = torchvision.models.vgg16().state_dict()
    stand_in = {k: 0.05 * torch.randn(v.shape) if k.startswith("features.") else torch.zeros(1).expand(v.shape)
                for k, v in layout.items()}
    torch.save(stand_in, bad)
    model, note = vqvae_objective.build_lpips(torch.device("cpu"))
    assert model is not None and "LPIPS on" in note
    net_sd = model.net.state_dict()
    assert torch.equal(net_sd["slice1.0.weight"], stand_in["features.0.weight"])
    assert torch.equal(net_sd["slice5.28.weight"], stand_in["features.28.weight"])
    x, y = torch.rand(2, 3, 32, 32) * 2 - 1, torch.rand(2, 3, 32, 32) * 2 - 1
    assert float(model(x, x).max()) == pytest.approx(0.0, abs=1e-6)
    assert float(model(x, y).min()) > 0
    tok = MultiScaleVQVAE(VQVAEConfig.from_dict(TOK))
    obj = vqvae_objective.VQVAEObjective(tok, vqvae_objective.LossWeights(lpips=0.5), model)
    loss, metrics = obj({"image": torch.rand(2, 3, 16, 16) * 2 - 1})
    assert metrics["lpips"] > 0
    assert float(loss) == pytest.approx(float(metrics["l1"] + metrics["l2"] + metrics["vq_loss"] + 0.5 * metrics["lpips"]),
                                        rel=1e-5)


def test_missing_manifest_and_bad_preset_fail_fast(data, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(SystemExit, match="manifest or shards not found"):
        vqvae.main(["--data", str(tmp_path / "none.jsonl"), "--out", str(out), "--max-steps", "2"])
    (tmp_path / "bad.jsonl").write_text('{"content": "a.png"}\n')  # no style
    with pytest.raises(SystemExit, match=r"bad.jsonl:1: missing or non-string field\(s\) \['style'\] \(--data takes"):
        vqvae.main(["--data", str(tmp_path / "bad.jsonl"), "--out", str(out), "--max-steps", "2"])
    with pytest.raises(SystemExit, match="--image-size 20 is not available"):
        vqvae.main(["--data", str(data["manifest"]), "--preset", str(data["preset"]), "--image-size", "20",
                    "--out", str(out), "--max-steps", "2"])
    with pytest.raises(SystemExit, match="--preset must be one of"):
        vqvae.main(["--data", str(data["manifest"]), "--preset", "d99", "--out", str(out), "--max-steps", "2"])
    assert not out.exists()


def test_image_size_drops_the_finest_scales():
    from training.parts.presets import resize_tokenizer

    tiny = VQVAEConfig.preset("tiny")
    side = 64 // tiny.downsample
    small = resize_tokenizer(tiny, 64)
    assert small.image_size == 64 and small.patch_nums[-1] == side
    assert small.patch_nums == tuple(p for p in tiny.patch_nums if p <= side)
    assert resize_tokenizer(tiny, None) == tiny
    with pytest.raises(ValueError, match="not available"):
        resize_tokenizer(tiny, 64 + tiny.downsample // 2)


def test_init_starts_from_a_saved_tokenizer_and_refuses_another_config(data, tmp_path):
    first = tmp_path / "first"
    common = ["--data", str(data["manifest"]), "--batch-size", "6", "--no-progress", "--restart-every", "0"]
    vqvae.main([*common, "--preset", str(data["preset"]), "--out", str(first), "--max-steps", "2"])
    saved = MultiScaleVQVAE.from_pretrained(first / "final")
    fresh = MultiScaleVQVAE(VQVAEConfig.from_dict(TOK))
    vqvae_objective.init_from(fresh, first / "final")
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, saved.state_dict()[k]), k
    vqvae.main([*common, "--preset", str(data["preset"]), "--out", str(tmp_path / "second"), "--max-steps", "1",
                "--lr", "1e-12", "--init", str(first / "final")])  # a tiny step: it starts where the first ended
    after = MultiScaleVQVAE.from_pretrained(tmp_path / "second" / "final")
    moved = {k: float((v - saved.state_dict()[k]).abs().max()) for k, v in after.state_dict().items()
             if v.is_floating_point() and "ema_vocab_hit" not in k}  # usage statistics, not weights
    assert max(moved.values()) < 1e-6

    other = tmp_path / "other.json"
    other.write_text(json.dumps({"tokenizer": {**TOK, "vocab_size": TOK["vocab_size"] * 2}}))
    with pytest.raises(SystemExit, match="tokenizer config differs"):
        vqvae.main([*common, "--preset", str(other), "--out", str(tmp_path / "third"), "--max-steps", "1",
                    "--init", str(first / "final")])
    with pytest.raises(SystemExit, match="--init"):
        vqvae.main([*common, "--preset", str(data["preset"]), "--out", str(tmp_path / "fourth"), "--max-steps", "1",
                    "--init", str(tmp_path / "nowhere")])
