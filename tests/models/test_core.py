"""Core model: reference conformance, checkpoint layouts, cache correctness, sampling, save/load, CLI."""
from __future__ import annotations

import json

import pytest
import torch

from stylevar.loaders.convert import load_stylevar, load_vqvae
from stylevar.config import GenerationConfig
from stylevar.models.state_dict import CheckpointError
from stylevar.cli import main as cli_main
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.models.transformer.naive import naive_generate, naive_teacher_forcing_logits
from training.sft.var_init import init_from_var


@pytest.fixture(scope="module")
def ref_models(golden):
    vq = load_vqvae(golden["vae_sd"], golden["vq_cfg"])
    model = load_stylevar(golden["stylevar_sd"], golden["tr_cfg"], vq)
    return vq, model


def test_tokenizer_matches_reference(golden, ref_models):
    vq, _ = ref_models
    g = golden["data"]
    for name in ("content", "style", "target"):
        idx = vq.encode_indices(g[name])
        assert len(idx) == len(golden["cfg"]["patch_nums"])
        for a, b in zip(idx, g[f"{name}_idx"]):
            assert torch.equal(a, b), name
    recon = vq.decode_indices(g["target_idx"])
    torch.testing.assert_close(recon, g["recon"], atol=1e-4, rtol=0)


def test_teacher_forcing_logits_match_reference(golden, ref_models):
    _, model = ref_models
    g = golden["data"]
    with torch.no_grad():
        logits = model.teacher_forcing_logits(g["content"], g["style"], g["target_idx"])
    assert logits.dtype == torch.float32 and logits.shape == g["logits"].shape
    torch.testing.assert_close(logits, g["logits"], atol=1e-4, rtol=0)


def _logits(model, g):
    with torch.no_grad():
        return model.teacher_forcing_logits(g["content"], g["style"], g["target_idx"])


@pytest.mark.slow
def test_wrapped_layouts_give_same_logits(golden, ref_models, tmp_path):
    vq, model = ref_models
    g, sd, cfg = golden["data"], golden["stylevar_sd"], golden["tr_cfg"]
    plain = _logits(model, g)
    path = tmp_path / "trainer.pth"
    torch.save({"trainer": {"var_wo_ddp": sd}, "epoch": 3}, path)
    torch.testing.assert_close(_logits(load_stylevar(path, cfg, vq), g), plain, atol=0, rtol=0)
    torch.testing.assert_close(_logits(load_stylevar({"model": sd}, cfg, vq), g), plain, atol=0, rtol=0)

    # LoRA-wrapped: base + (B @ A) * alpha / rank equals the plain weight
    gen = torch.Generator().manual_seed(0)
    rank, alpha = 4, 8
    lora_sd = dict(sd)
    for name in ("blocks.0.attn.mat_qkv_guide", "blocks.1.attn.mat_qkv_target", "blocks.0.ffn.fc1", "blocks.1.attn.proj"):
        W = lora_sd.pop(f"{name}.weight")
        A = torch.randn(rank, W.shape[1], generator=gen)
        B = torch.randn(W.shape[0], rank, generator=gen)
        lora_sd[f"{name}.lora_A"], lora_sd[f"{name}.lora_B"] = A, B
        lora_sd[f"{name}.base_weight"] = W - (B @ A) * (alpha / rank)
    path = tmp_path / "grpo.pth"
    torch.save({"model": lora_sd, "args": {"lora_rank": rank, "lora_alpha": alpha}}, path)
    torch.testing.assert_close(_logits(load_stylevar(path, cfg, vq), g), plain, atol=1e-5, rtol=0)

    lora_only = {k: v for k, v in lora_sd.items() if "lora_" in k}
    with pytest.raises(CheckpointError, match="LoRA-only") as e:
        load_stylevar({"model": lora_only, "args": {"lora_rank": rank, "lora_alpha": alpha}}, cfg, vq)
    assert "blocks.0.attn.mat_qkv_guide" in str(e.value)


def test_mismatched_checkpoint_names_keys(golden, ref_models):
    vq, _ = ref_models
    sd = dict(golden["stylevar_sd"])
    del sd["head.bias"]
    sd["extra.weight"] = torch.zeros(3)
    sd["feat_emb.weight"] = torch.zeros(7, 7)
    with pytest.raises(CheckpointError) as e:
        load_stylevar(sd, golden["tr_cfg"], vq)
    msg = str(e.value)
    assert "missing keys: head.bias" in msg and "unexpected keys: extra.weight" in msg
    assert "feat_emb.weight: checkpoint (7, 7)" in msg
    with pytest.raises(FileNotFoundError, match="nope.pth"):
        load_stylevar("nope.pth", golden["tr_cfg"], vq)


def test_unreadable_and_wrong_tokenizer_files(golden, tmp_path):
    p = tmp_path / "broken.pth"
    p.write_bytes(b"this is not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        load_vqvae(p, golden["vq_cfg"])
    with pytest.raises(CheckpointError, match="shape mismatches: quantize.embedding.weight"):
        sd = dict(golden["vae_sd"])
        sd["quantize.embedding.weight"] = torch.zeros(10, 16)
        load_vqvae(sd, golden["vq_cfg"])
    # training statistics with another number of scales are accepted
    sd = dict(golden["vae_sd"])
    sd["quantize.ema_vocab_hit_SV"] = torch.zeros(10, 512)
    load_vqvae(sd, golden["vq_cfg"])


def test_init_from_var(golden, ref_models):
    vq, _ = ref_models
    var_sd = golden["var_sd"]
    model, summary = init_from_var(var_sd, golden["tr_cfg"], vq)
    C = golden["tr_cfg"].embed_dim
    for i in range(golden["tr_cfg"].depth):
        W = var_sd[f"blocks.{i}.attn.mat_qkv.weight"]
        a = model.blocks[i].attn
        assert torch.equal(a.q_guide.weight, W[:C]) and torch.equal(a.kv_target.weight, W[C:])
        assert torch.equal(a.q_guide.bias, var_sd[f"blocks.{i}.attn.q_bias"])
        assert torch.equal(a.v_bias, var_sd[f"blocks.{i}.attn.v_bias"])
        assert summary["split"][f"blocks.{i}.attn.mat_qkv.weight"] == [
            f"blocks.{i}.attn.q_guide.weight", f"blocks.{i}.attn.kv_target.weight"]
    assert "class_emb.weight" in summary["dropped"]
    assert "head.weight" in summary["copied"] and torch.equal(model.head.weight, var_sd["head.weight"])
    assert any(k.startswith("feat_emb") for k in summary["fresh"])
    assert any(k.startswith("style_encoder") for k in summary["fresh"]) or summary["encoders"] == "imagenet"
    with pytest.raises(CheckpointError, match="not a class-conditional VAR"):
        init_from_var(golden["stylevar_sd"], golden["tr_cfg"], vq)


@pytest.mark.slow
def test_generate_cache_matches_teacher_forcing(golden, ref_models):
    _, model = ref_models
    g = golden["data"]
    content = torch.cat([g["content"], g["content"][:1]])
    style = torch.cat([g["style"], g["style"][1:]])
    images, idx = model.generate_with_indices(content, style, top_k=1, seed=0)
    assert images.shape == (3, 3, 128, 128) and 0 <= images.min() and images.max() <= 1
    with torch.no_grad():
        logits = model.teacher_forcing_logits(content, style, idx)
    assert torch.equal(logits.argmax(-1), torch.cat(idx, dim=1))


@pytest.mark.slow
def test_naive_blend_computes_the_same(golden, ref_models):
    _, model = ref_models
    g = golden["data"]
    torch.testing.assert_close(naive_teacher_forcing_logits(model, g["content"], g["style"], g["target_idx"]),
                               _logits(model, g), atol=1e-4, rtol=0)
    fast = model.generate(g["content"], g["style"], seed=5, top_k=50, top_p=0.9)
    naive = naive_generate(model, g["content"], g["style"], seed=5, top_k=50, top_p=0.9)
    torch.testing.assert_close(fast, naive, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_seeds(micro_pipeline):
    model = micro_pipeline.model
    gen = torch.Generator().manual_seed(1)
    c, s = torch.rand(3, 3, 32, 32, generator=gen) * 2 - 1, torch.rand(3, 3, 32, 32, generator=gen) * 2 - 1
    state = torch.random.get_rng_state()
    a = model.generate(c, s, seed=7, top_k=0, top_p=0)
    assert torch.equal(torch.random.get_rng_state(), state), "generate must not touch the global RNG"
    assert torch.equal(a, model.generate(c, s, seed=7, top_k=0, top_p=0))
    assert not torch.equal(a, model.generate(c, s, seed=8, top_k=0, top_p=0))
    # one seed per row: each row is what a batch of one with that seed gives
    rows = model.generate(c, s, seed=[3, 4, 5], top_k=0, top_p=0)
    for i, sd in enumerate([3, 4, 5]):
        torch.testing.assert_close(rows[i:i + 1], model.generate(c[i:i + 1], s[i:i + 1], seed=sd, top_k=0, top_p=0),
                                   atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="seeds"):
        model.generate(c, s, seed=[1, 2])


@pytest.mark.slow
def test_generate_options(micro_pipeline):
    model = micro_pipeline.model
    c = torch.zeros(2, 3, 32, 32)
    seen = []
    out, idx = model.generate_with_indices(c, c, seed=0, on_scale=lambda k, img: seen.append((k, tuple(img.shape))),
                                           alphas=[0.1, 0.2, 0.3, 0.4], style_strength=0.5)
    assert [k for k, _ in seen] == [0, 1, 2, 3] and all(sh == (2, 3, 32, 32) for _, sh in seen)
    assert [t.shape for t in idx] == [(2, 1), (2, 4), (2, 16), (2, 64)]
    torch.testing.assert_close(model.blend_alphas([0.1, 0.2, 0.3, 0.98], 0.5), torch.tensor([0.35, 0.45, 0.55, 0.99]))
    with pytest.raises(ValueError, match="one value per scale"):
        model.generate(c, c, alphas=[0.5])
    with pytest.raises(ValueError, match="style_strength"):
        model.generate(c, c, style_strength=2)


@pytest.mark.slow
def test_generate_return_indices_is_deprecated_and_still_gives_the_indices(micro_pipeline):
    model = micro_pipeline.model
    c = torch.zeros(2, 3, 32, 32)
    with pytest.warns(DeprecationWarning, match="use generate_with_indices"):
        images, idx = model.generate(c, c, seed=0, return_indices=True)
    want = model.generate_with_indices(c, c, seed=0)
    assert torch.equal(images, want.images) and all(torch.equal(a, b) for a, b in zip(idx, want.indices))


def test_save_load_roundtrip(micro_pipeline, tmp_path):
    d = micro_pipeline.save_pretrained(tmp_path / "m")
    loaded = StylePipeline.from_pretrained(d, device="cpu")
    gen = torch.Generator().manual_seed(0)
    c, s = torch.rand(2, 3, 32, 32, generator=gen) * 2 - 1, torch.rand(2, 3, 32, 32, generator=gen) * 2 - 1
    idx = micro_pipeline.model.tokenizer.encode_indices(c)
    with torch.no_grad():
        assert torch.equal(micro_pipeline.model.teacher_forcing_logits(c, s, idx),
                           loaded.model.teacher_forcing_logits(c, s, idx))
    (d / "transformer.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="transformer.safetensors"):
        StylePipeline.from_pretrained(d)


@pytest.mark.slow
def test_convert_cli(golden, tmp_path, reference_dir):
    torch.save(golden["vae_sd"], tmp_path / "vae.pth")
    torch.save({"trainer": {"var_wo_ddp": golden["stylevar_sd"]}}, tmp_path / "model.pth")
    out = tmp_path / "converted"
    rc = cli_main(["convert", "--vae", str(tmp_path / "vae.pth"), "--model", str(tmp_path / "model.pth"),
                   "--config", str(reference_dir / "golden_small" / "config.json"), "--out", str(out)])
    assert rc == 0
    pipe = StylePipeline.from_pretrained(out, device="cpu")
    g = golden["data"]
    with torch.no_grad():
        logits = pipe.model.teacher_forcing_logits(g["content"], g["style"], g["target_idx"])
    torch.testing.assert_close(logits, g["logits"], atol=1e-4, rtol=0)
    assert json.loads((out / "config.json").read_text())["format"] == "stylevar"
    # a wrong preset gives a readable error and a non-zero exit
    assert cli_main(["convert", "--vae", str(tmp_path / "vae.pth"), "--model", str(tmp_path / "model.pth"),
                     "--preset", "d16", "--out", str(tmp_path / "bad")]) == 2


def test_stylize_cli(micro_model_dir, tmp_path):
    from PIL import Image

    Image.new("RGB", (60, 40), (200, 30, 30)).save(tmp_path / "c.png")
    Image.new("RGB", (50, 50), (20, 30, 200)).save(tmp_path / "s.png")
    rc = cli_main(["stylize", str(tmp_path / "c.png"), str(tmp_path / "s.png"), "-o", str(tmp_path / "o.png"),
                   "--model", str(micro_model_dir), "--seed", "1", "--style-strength", "0.5"])
    assert rc == 0
    assert Image.open(tmp_path / "o.png").size == (60, 40)
    (tmp_path / "bad.png").write_bytes(b"garbage")
    assert cli_main(["stylize", str(tmp_path / "bad.png"), str(tmp_path / "s.png"), "-o", str(tmp_path / "x.png"),
                     "--model", str(micro_model_dir)]) == 2


@pytest.mark.slow
def test_bench_cli(capsys, tmp_path):
    record = tmp_path / "results" / "bench.jsonl"  # its folder is made
    rc = cli_main(["bench", "--preset", "tiny", "--batch-sizes", "1", "--repeats", "1", "--warmup", "0",
                   "--tf-batch", "1", "--naive", "--json", "--record", str(record)])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert json.loads(record.read_text()) == res
    assert res["generate"][0]["ms_per_image"] > 0 and res["teacher_forcing"]["tokens_per_s"] > 0
    assert res["naive"]["speedup"] > 0


@pytest.mark.slow
def test_model_recommended_sampling_settings(micro_pipeline, tmp_path):
    from PIL import Image

    pipe = StylePipeline(micro_pipeline.model, micro_pipeline.config.__class__(
        micro_pipeline.config.tokenizer, micro_pipeline.config.transformer, generation={"top_k": 1, "top_p": 0.0}))
    d = pipe.save_pretrained(tmp_path / "m")
    loaded = StylePipeline.from_pretrained(d, device="cpu")
    assert loaded.config.generation == {"top_k": 1, "top_p": 0.0}
    assert loaded.generation_config(top_k=None, style_strength=0.2) == GenerationConfig(1, 0.0, style_strength=0.2)
    assert loaded.generation_config(top_k=5).top_k == 5
    c, s = Image.new("RGB", (32, 32), (200, 10, 10)), Image.new("RGB", (32, 32), (10, 10, 200))
    # greedy by the model's recommendation: every seed gives the same picture
    assert loaded(c, s, seed=1).tobytes() == loaded(c, s, seed=2).tobytes()
