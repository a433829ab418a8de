"""training.sft on a tiny custom model (16 px, 3 scales): training, logging, exact resume after kill -9,
torchrun (gloo) equivalence, bad data, clear input errors, --init-var from a reference-layout VAR."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from data_tools.synth import SynthConfig, generate
from stylevar import StylePipeline
from stylevar.config import StyleVARConfig, VQVAEConfig
from stylevar.models.pretrained import load_safetensors
from stylevar.models.tokenizer import MultiScaleVQVAE
from tests import reference
from tests.conftest import run_recipe, single_thread_env
from training.sft import __main__ as sft
from training.sft.model import with_variants
from training.sft.objective import SFTObjective
from training.parts.log import read_log

REPO = Path(__file__).resolve().parents[2]
PY = Path(sys.executable)  # the environment the tests run in
TORCHRUN = PY.with_name("torchrun")

TOK = dict(vocab_size=64, z_channels=8, ch=8, ch_mult=[1, 1, 2], num_res_blocks=1, patch_nums=[1, 2, 4],
           using_sa=False, using_mid_sa=False)  # 16 px
TRANS = dict(depth=2, embed_dim=64, num_heads=2, patch_nums=[1, 2, 4], vocab_size=64, z_channels=8,
             alpha_nums=[0.2, 0.5, 0.7], image_encoder="cnn", encoder_dim=32)


pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


_env = single_thread_env


def write_run_inputs(root: Path, count: int, val_fraction: float = 0.2, transformer: dict | None = None) -> dict:
    """What an SFT run reads, under ``root``: ``count`` synthetic 16 px triplets, the preset (``transformer``, by
    default ``TRANS``, over ``TOK``), a fresh tokenizer."""
    manifest = generate(SynthConfig(out=str(root / "data"), count=count, size=16, seed=3, val_fraction=val_fraction))
    preset = root / "preset.json"
    preset.write_text(json.dumps({"tokenizer": TOK, "transformer": TRANS if transformer is None else transformer}))
    torch.manual_seed(0)
    MultiScaleVQVAE(VQVAEConfig.from_dict(TOK)).save_pretrained(root / "tok", extra={})
    return {"root": root, "manifest": manifest, "preset": preset, "tok": root / "tok"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return write_run_inputs(tmp_path_factory.mktemp("sft"), count=40)


def _args(s, out, steps, *extra) -> list[str]:
    return ["--data", str(s["manifest"]), "--preset", str(s["preset"]), "--tokenizer", str(s["tok"]),
            "--out", str(out), "--max-steps", str(steps), "--no-progress", *map(str, extra)]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run / "final" / "transformer.safetensors"))


def test_sft_trains_logs_and_writes_a_model_dir(setup, tmp_path):
    out = tmp_path / "run"
    sft.main(_args(setup, out, 24, "--batch-size", 8, "--lr", 3e-3, "--log-every", 4, "--val-every", 12,
                   "--save-every", 12, "--alpha-jitter", 0.1, "--no-augment", "--label-smoothing", 0.1))
    log = read_log(out)
    train = [r for r in log if "loss" in r]
    assert [r["step"] for r in train] == [4, 8, 12, 16, 20, 24]
    assert all({"step", "loss", "lr", "ce", "acc", "grad_norm"} <= set(r) for r in train)
    assert train[-1]["loss"] < train[0]["loss"] - 0.3, [r["loss"] for r in train]
    val = [r for r in log if "val_loss" in r]
    assert [r["step"] for r in val] == [12, 24]
    assert all({"val_loss", "val_acc", "val_acc_s0", "val_acc_s2"} <= set(r) for r in val)
    assert val[-1]["val_images"] == 8
    # two-level lr: 3e-3 until 0.6 * 24 = step 14 (0-based), then 0.2x
    assert train[0]["lr"] == pytest.approx(3e-3) and train[-1]["lr"] == pytest.approx(6e-4)
    pipe = StylePipeline.from_pretrained(out / "final", device="cpu")
    assert pipe.image_size == 16 and pipe.config.name == "stylevar-sft"
    assert json.loads((out / "skipped.json").read_text())["count"] == 0
    # the tokenizer stayed frozen
    tok_sd = load_safetensors(setup["tok"] / "tokenizer.safetensors")
    for k, v in pipe.model.tokenizer.state_dict().items():
        assert torch.equal(v, tok_sd[k]), k


@pytest.mark.slow
def test_resume_after_kill_9_is_bitwise_exact(setup, tmp_path):
    steps, half = 40, 20
    common = ("--batch-size", 4, "--save-every", half, "--log-every", 5, "--alpha-jitter", 0.1)
    run_recipe("training.sft", _args(setup, tmp_path / "full", steps, *common), tmp_path / "full")
    run_recipe("training.sft", _args(setup, tmp_path / "killed", steps, *common), tmp_path / "killed",
               kill_at_step=half)
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "killed")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    strip = lambda log: [{k: v for k, v in r.items() if k not in ("time", "steps_per_s")} for r in log]  # noqa: E731
    assert strip(read_log(tmp_path / "full")) == strip(read_log(tmp_path / "killed"))

    # the same RUN with another setting is refused before any work
    before = (tmp_path / "killed" / "log.jsonl").read_text()
    with pytest.raises(SystemExit, match=r"different configuration \(lr: 0.0005 -> 0.001\)"):
        sft.main([*_args(setup, tmp_path / "killed", steps, *common), "--lr", "1e-3"])
    assert (tmp_path / "killed" / "log.jsonl").read_text() == before


def test_dataloader_workers_and_activation_checkpointing_do_not_change_training(setup, tmp_path):
    common = ("--batch-size", 8, "--log-every", 2, "--save-every", 4)
    sft.main(_args(setup, tmp_path / "w0", 4, *common, "--num-workers", 0))
    sft.main(_args(setup, tmp_path / "w2", 4, *common, "--num-workers", 2, "--activation-checkpointing"))
    a, b = _weights(tmp_path / "w0"), _weights(tmp_path / "w2")
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_shards_train_and_resume_exactly(setup, tmp_path):
    from data_tools import shards

    assert shards.main(["--manifest", str(setup["manifest"]), "--out", str(tmp_path / "shards"),
                        "--shard-size", "8", "--workers", "1"]) in (0, None)
    s = {**setup, "manifest": tmp_path / "shards"}
    common = ("--batch-size", 4, "--save-every", 5, "--log-every", 5)
    sft.main(_args(s, tmp_path / "full", 10, *common))
    sft.main(_args(s, tmp_path / "cut", 10, *common))
    # the disk state of a run killed after its step-5 checkpoint: later checkpoints and final/ never written
    (tmp_path / "cut" / "checkpoints" / "step-00000010.pt").unlink()
    for f in (tmp_path / "cut" / "final").iterdir():
        f.unlink()
    (tmp_path / "cut" / "final").rmdir()
    state = torch.load(tmp_path / "cut" / "checkpoints" / "step-00000005.pt", weights_only=True)
    assert state["data"]["epoch"] == 0 and state["data"]["index"] == 5  # 32 samples: 8 batches per epoch
    sft.main(_args(s, tmp_path / "cut", 10, *common))
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "cut")
    for k in a:
        assert torch.equal(a[k], b[k]), k
    val = [r for r in read_log(tmp_path / "full") if "val_loss" in r]
    assert val[-1]["val_images"] == 8


@pytest.mark.slow
def test_torchrun_two_processes_match_one(setup, tmp_path):
    common = ("--batch-size", 8, "--save-every", 3, "--log-every", 1, "--alpha-jitter", 0.1, "--lr", 2e-3)
    single = subprocess.run([str(PY), "-m", "training.sft", *_args(setup, tmp_path / "one", 3, *common)],
                            cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    two = subprocess.run([str(TORCHRUN), "--standalone", "--nproc_per_node", "2", "-m", "training.sft",
                          *_args(setup, tmp_path / "two", 3, *common)],
                         cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "world size 2" in two.stderr
    a, b = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=2e-5, rtol=1e-4, msg=k)
    la, lb = read_log(tmp_path / "one"), read_log(tmp_path / "two")
    assert [r["step"] for r in la] == [r["step"] for r in lb]
    for ra, rb in zip(la, lb):
        for key in ("loss", "acc", "val_loss", "val_acc"):
            if key in ra:
                assert ra[key] == pytest.approx(rb[key], rel=1e-4, abs=1e-5), (ra["step"], key)


def test_bad_images_are_skipped_counted_and_reported(setup, tmp_path):
    data = tmp_path / "data"
    manifest = generate(SynthConfig(out=str(data), count=16, size=16, seed=5, val_fraction=0.25))
    entries = [json.loads(line) for line in manifest.read_text().splitlines()]
    train = [e for e in entries if e["split"] == "train"]
    (data / train[1]["content"]).write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    (data / train[4]["target"]).unlink()
    s = {**setup, "manifest": manifest}
    out = tmp_path / "run"
    sft.main(_args(s, out, 3, "--batch-size", 4, "--log-every", 1))  # 12 train triplets: 3 steps = 1 epoch
    report = json.loads((out / "skipped.json").read_text())
    assert report["count"] == 2
    assert set(report["files"]) == {str((data / train[1]["content"]).resolve()), str((data / train[4]["target"]).resolve())}
    assert "file not found" in report["files"][str((data / train[4]["target"]).resolve())]
    log = read_log(out)
    assert log[-2]["step"] == 3 and log[-2]["skipped_files"] == 2  # last train line (then validation)
    assert (out / "final" / "transformer.safetensors").exists()


def test_missing_inputs_fail_before_any_work(setup, tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit, match="manifest or shards not found"):
        sft.main(_args({**setup, "manifest": tmp_path / "nope.jsonl"}, out, 2))
    (tmp_path / "notes.md").write_text("# not a manifest\n")
    (tmp_path / "pictures").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "pictures" / "a.png")
    for wrong, said in (("notes.md", r"notes.md:1: not valid JSON"), ("pictures", "holds neither manifest.jsonl nor")):
        with pytest.raises(SystemExit, match=rf"^error: --data .*{said}.* python -m data_tools.synth makes a set"):
            sft.main(_args({**setup, "manifest": tmp_path / wrong}, out, 2))
    with pytest.raises(SystemExit, match="--tokenizer .*not found"):
        sft.main(_args({**setup, "tok": tmp_path / "no_tokenizer"}, out, 2))
    (tmp_path / "empty_tok").mkdir()
    with pytest.raises(SystemExit, match="lacks config.json"):
        sft.main(_args({**setup, "tok": tmp_path / "empty_tok"}, out, 2))
    with pytest.raises(SystemExit, match="--init-var .*not found"):
        sft.main([*_args(setup, out, 2), "--init-var", str(tmp_path / "var.pth")])
    assert not out.exists()


def test_init_var_from_a_reference_layout_checkpoint(tmp_path, reference_dir):
    cfg = reference.read_config(reference_dir)
    table = reference.read_key_table(reference_dir / "golden_small" / "var_keys.tsv")
    var_path = tmp_path / "var_small.pth"
    torch.save(reference.seeded_state(table, cfg["patch_nums"], seed=cfg["seed"] + 2000), var_path)

    pn = cfg["patch_nums"]
    tok = dict(vocab_size=cfg["V"], z_channels=cfg["Cvae"], ch=8, ch_mult=[1, 2], num_res_blocks=1, patch_nums=pn,
               using_sa=False, using_mid_sa=False)  # latent 8x8 at 16 px
    trans = dict(depth=cfg["depth"], patch_nums=pn, vocab_size=cfg["V"], z_channels=cfg["Cvae"],
                 alpha_nums=cfg["alpha_nums"], image_encoder="cnn", encoder_dim=32)
    preset = tmp_path / "preset.json"
    preset.write_text(json.dumps({"tokenizer": tok, "transformer": trans}))
    torch.manual_seed(0)
    MultiScaleVQVAE(VQVAEConfig.from_dict(tok)).save_pretrained(tmp_path / "tok", extra={})
    manifest = generate(SynthConfig(out=str(tmp_path / "data"), count=8, size=16, seed=1, val_fraction=0.25))
    out = tmp_path / "run"
    sft.main(["--data", str(manifest), "--preset", str(preset), "--tokenizer", str(tmp_path / "tok"),
              "--init-var", str(var_path), "--out", str(out), "--max-steps", "2", "--batch-size", "2",
              "--log-every", "1", "--no-progress"])
    log = read_log(out)
    init = [r for r in log if r.get("event") == "init_from_var"]
    assert len(init) == 1 and init[0]["step"] == 0
    assert init[0]["copied"] > 10 and init[0]["split"] == 3 * cfg["depth"]
    assert "class_emb.weight" in init[0]["dropped"]
    summary = json.loads((out / "init_summary.json").read_text())
    assert "head.weight" in summary["copied"]
    assert [r["step"] for r in log if "loss" in r] == [1, 2]
    # the copied weights are really there before training moved them (lr is tiny after 2 steps, compare loosely)
    sd = torch.load(var_path, weights_only=True)
    pipe = StylePipeline.from_pretrained(out / "final", device="cpu")
    assert StyleVARConfig.from_dict(pipe.config.transformer.to_dict()).embed_dim == 64 * cfg["depth"]
    delta = (pipe.model.head.weight - sd["head.weight"]).abs().max()
    assert delta < 0.05, float(delta)


def test_no_weight_decay_on_embeddings_norms_biases_and_scales():
    from training.parts.optim import decay_split

    torch.manual_seed(0)
    model = StylePipeline.random((VQVAEConfig.from_dict(TOK), StyleVARConfig.from_dict(TRANS))).model
    decay, no_decay = decay_split(model)
    assert not any(n.startswith("tokenizer.") for n in decay + no_decay), "the frozen tokenizer is not optimised"
    for name in ("pos_start", "pos_1LC", "lvl_embed.weight", "blocks.0.attn.scale_mul_1H11", "head.bias",
                 "blocks.1.attn.v_bias", "blocks.0.ffn.fc1.bias"):
        assert name in no_decay, name
    for name in ("head.weight", "word_embed.weight", "blocks.0.attn.q_guide.weight", "blocks.0.attn.kv_target.weight",
                 "blocks.0.ffn.fc2.weight", "feat_emb.weight"):
        assert name in decay, name
    norms = [n for n, m in model.named_modules() if isinstance(m, torch.nn.GroupNorm) and not n.startswith("tokenizer")]
    assert norms and all(f"{n}.weight" in no_decay for n in norms)
    assert set(decay) | set(no_decay) == {n for n, p in model.named_parameters() if p.requires_grad}


def test_two_level_schedule_with_warmup():
    from training.parts.optim import ScheduleConfig

    cfg = ScheduleConfig(max_steps=100, warmup_steps=10, drop_fraction=0.6, drop_factor=0.2)
    assert cfg.factor(0) == pytest.approx(0.1) and cfg.factor(9) == pytest.approx(1.0)
    assert cfg.factor(59) == 1.0 and cfg.factor(60) == pytest.approx(0.2) and cfg.factor(99) == pytest.approx(0.2)
    assert ScheduleConfig(max_steps=100, drop_step=30).factor(30) == pytest.approx(0.2)
    with pytest.raises(ValueError):
        ScheduleConfig(max_steps=100, drop_fraction=1.5)


def test_drop_path_rate_is_recorded_and_runs_from_before_it_resume(setup, tmp_path):
    out = tmp_path / "run"
    sft.main(_args(setup, out, 2, "--batch-size", 4, "--drop-path-rate", 0.2))
    assert json.loads((out / "final" / "config.json").read_text())["transformer"]["drop_path_rate"] == 0.2
    assert json.loads((out / "config.json").read_text())["drop_path_rate"] == 0.2

    # a run begun before the option existed: its RUN/config.json lacks it; left at its value then, it resumes
    old = tmp_path / "old"
    sft.main(_args(setup, old, 2, "--batch-size", 4))
    recorded = json.loads((old / "config.json").read_text())
    assert recorded["transformer_config"]["drop_path_rate"] == 0.0  # the custom preset: off
    for key in ("drop_path_rate", "token_cache"):
        recorded.pop(key)
    recorded["transformer_config"].pop("drop_path_rate")
    (old / "config.json").write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    assert sft.main(_args(setup, old, 2, "--batch-size", 4)) == 0
    with pytest.raises(SystemExit, match=r"drop_path_rate: None -> 0.1"):
        sft.main(_args(setup, old, 2, "--batch-size", 4, "--drop-path-rate", 0.1))


@pytest.mark.slow
def test_compiled_blocks_train_as_eager_ones(setup, tmp_path):
    common = ("--batch-size", 4, "--drop-path-rate", 0.3, "--log-every", 1)
    sft.main(_args(setup, tmp_path / "eager", 3, *common))
    sft.main(_args(setup, tmp_path / "compiled", 3, *common, "--compile"))
    a, b = _weights(tmp_path / "eager"), _weights(tmp_path / "compiled")
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4, msg=k)


def test_scale_weighted_loss_and_added_variants(setup, tmp_path):
    """--scale-gamma weighs the coarse scales' tokens up (gamma 0 is the plain mean); --add-variants grows an
    --init model by zero-initialised variant modules: it computes what it did until training moves them."""
    from training.parts.scale_weights import panw_weights

    first = tmp_path / "first"
    sft.main(_args(setup, first, 4, "--batch-size", 4, "--no-augment", "--save-every", 4))
    model = StylePipeline.from_pretrained(first / "final", device="cpu").model
    grown = with_variants(model, ["colour_stats"])
    assert grown.colour_in is not None and grown.cfg.colour_stats and not model.cfg.colour_stats
    g = torch.Generator().manual_seed(0)
    c, s = torch.rand(2, 3, 16, 16, generator=g) * 2 - 1, torch.rand(2, 3, 16, 16, generator=g) * 2 - 1
    idx = model.tokenizer.encode_indices(c)
    with torch.no_grad():
        torch.testing.assert_close(grown.teacher_forcing_logits(c, s, idx), model.teacher_forcing_logits(c, s, idx))
    with pytest.raises(SystemExit, match="unknown"):
        with_variants(model, ["sparkle"])

    # the weighted loss by hand, from the objective's own logits
    batch = {"content": c, "style": s, "target": c}
    plain = SFTObjective(model, label_smoothing=0.0, alpha_jitter=0.0, seed=0)
    weighted = SFTObjective(model, label_smoothing=0.0, alpha_jitter=0.0, seed=0, scale_gamma=1.0)
    with torch.no_grad():
        loss_plain, _ = plain(batch)
        loss_weighted, metrics = weighted(batch)
        logits = model.teacher_forcing_logits(c, s, idx)
        ce_BL = torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.cat(idx, 1).flatten(),
                                                  reduction="none").view(2, -1)
    w_L = panw_weights(model.cfg.patch_nums, 1.0)
    per_scale = [x.mean() for x in ce_BL.split([1, 4, 16], dim=1)]
    torch.testing.assert_close(w_L.split([1, 4, 16])[0].sum(), torch.tensor(1 / 3))  # each scale a third
    torch.testing.assert_close(loss_weighted, torch.stack(per_scale).mean(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss_plain, ce_BL.mean(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(metrics["ce"], ce_BL.mean(), rtol=1e-5, atol=1e-5)  # logged CE stays the plain one

    # through the recipe: both flags together, recorded in the model it writes
    out = tmp_path / "grown"
    sft.main(_args(setup, out, 4, "--batch-size", 4, "--no-augment", "--init", first / "final",
                   "--add-variants", "colour_stats", "--scale-gamma", 1.0))
    assert StylePipeline.from_pretrained(out / "final", device="cpu").config.transformer.colour_stats
    with pytest.raises(SystemExit, match="--add-variants needs --init"):
        sft.main(_args(setup, tmp_path / "x", 2, "--add-variants", "colour_stats"))
    with pytest.raises(SystemExit, match="--scale-gamma"):
        sft.main(_args(setup, tmp_path / "x", 2, "--scale-gamma", -1))
