"""The SFT step's tokenizer inputs: one fused encode of target, style and content, the condition made from
token maps, and the token cache (built once beside the data, keyed by the tokenizer's weights, resumable)."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from data_tools.synth import SynthConfig, generate
from stylevar.config import VQVAEConfig
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.models.tokenizer import MultiScaleVQVAE
from stylevar.models.transformer import StyleVAR
from tests.conftest import micro_configs
from training.sft import __main__ as sft
from training.parts import token_cache
from training.parts.data import AugmentConfig, TripletDataset
from training.parts.distributed import DistEnv
from training.sft.objective import SFTObjective
from training.parts.token_inputs import condition_from_tokens, encode_triplets, tokens_from_indices

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def _triplet(batch: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.rand(batch, 3, 32, 32, generator=g) * 2 - 1 for _ in range(3))  # target, style, content


def _model(**variant) -> StyleVAR:
    vq_cfg, tr_cfg = micro_configs()
    model = StylePipeline.random((vq_cfg, tr_cfg), seed=0).model
    if not variant:
        return model
    other = StyleVAR(dataclasses.replace(tr_cfg, **variant), model.tokenizer)
    torch.manual_seed(2)
    for p in other.parameters():  # the variants' zero-initialised maps too: every term counts
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    return other


@pytest.mark.parametrize("variant", [{}, {"content_injection": True}, {"colour_stats": True}])
def test_the_condition_from_token_maps_is_the_models(variant):
    model = _model(**variant)
    target, style, content = _triplet()
    tokens, idx_B3L = encode_triplets(model.tokenizer, target, style, content)
    with torch.no_grad():
        ours, theirs = condition_from_tokens(model, content, style, tokens), model.condition(content, style)
    for f in dataclasses.fields(theirs):
        a, b = getattr(ours, f.name), getattr(theirs, f.name)
        assert (a is None) == (b is None), f.name
        if a is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f.name)
    # the fused encode gives each image's own token maps
    for k, m in enumerate(model.tokenizer.encode_indices(target)):
        assert torch.equal(tokens.target[k], m)
    assert idx_B3L.shape == (3, 3, model.cfg.num_tokens)
    assert torch.equal(idx_B3L[:, 1], torch.cat(model.tokenizer.encode_indices(style), 1))


def test_token_maps_read_back_give_the_same_streams():
    model = _model()
    target, style, content = _triplet(seed=1)
    tokens, idx_B3L = encode_triplets(model.tokenizer, target, style, content)
    back = tokens_from_indices(model.tokenizer, idx_B3L.to(torch.int16))
    for a, b in zip(back.target, tokens.target):
        assert torch.equal(a, b)
    # the same sums; the Phi convolutions run at another batch size, so up to float rounding (~1e-7)
    torch.testing.assert_close(back.style_BLc, tokens.style_BLc, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(back.content_BLc, tokens.content_BLc, rtol=1e-6, atol=1e-6)


def test_fused_unfused_and_cached_objectives_agree():
    model = _model()
    model.train()
    target, style, content = _triplet(seed=2)
    batch = {"target": target, "style": style, "content": content}
    losses = {}
    for name, fuse in (("three encodes", False), ("fused", True)):
        objective = SFTObjective(model, label_smoothing=0.1, alpha_jitter=0.1, seed=0, fuse_encodes=fuse)
        losses[name] = objective(batch)[0]
    idx_B3L = encode_triplets(model.tokenizer, target, style, content)[1]
    cached = {"style": style, "content": content, "tokens_B3L": idx_B3L}
    losses["cached"] = SFTObjective(model, label_smoothing=0.1, alpha_jitter=0.1, seed=0)(cached)[0]
    assert losses["three encodes"].item() == losses["fused"].item()
    assert losses["cached"].item() == pytest.approx(losses["fused"].item(), rel=1e-6)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    manifest = generate(SynthConfig(out=str(root / "data"), count=24, size=32, seed=4, val_fraction=0.25))
    return root, manifest


def _dataset(manifest, augment=None) -> TripletDataset:
    return TripletDataset(manifest, "train", 32, augment)


def test_the_cache_is_built_once_and_read_back(data, monkeypatch):
    _, manifest = data
    monkeypatch.setattr(token_cache, "CHUNK", 8)  # 18 train triplets: 3 chunks
    model, env = _model(), DistEnv(0, 1, 0, torch.device("cpu"))
    ds = _dataset(manifest)
    first = token_cache.open_token_cache(ds, model.tokenizer, env, batch_size=4)
    assert first.built == 3 and first.tokens_N3L.shape == (18, 3, model.cfg.num_tokens)
    assert first.tokens_N3L.dtype == torch.int16
    assert first.folder.parent == manifest.parent / ".token-cache"
    for i in (0, 9, 17):
        item = ds[i]
        _, idx = encode_triplets(model.tokenizer, item["target"][None], item["style"][None], item["content"][None])
        assert torch.equal(first.lookup(torch.tensor([i])).long(), idx), i
    again = token_cache.open_token_cache(ds, model.tokenizer, env)
    assert again.built == 0 and torch.equal(again.tokens_N3L, first.tokens_N3L)
    assert "18 triplets, read back" in again.describe()

    # a killed build: the chunk it did not write is built, the others are read
    (first.folder / "chunk-000001.safetensors").unlink()
    (first.folder / "chunk-000002.safetensors").write_bytes(b"torn")
    resumed = token_cache.open_token_cache(ds, model.tokenizer, env)
    assert resumed.built == 2 and torch.equal(resumed.tokens_N3L, first.tokens_N3L)

    # an image that changed: its chunk is built again
    os.utime(ds.entries[10].paths["style"], ns=(1, 1))
    assert token_cache.open_token_cache(ds, model.tokenizer, env).built == 1


def test_another_tokenizer_never_reuses_the_maps(data, monkeypatch):
    _, manifest = data
    model, env = _model(), DistEnv(0, 1, 0, torch.device("cpu"))
    ds = _dataset(manifest)
    a = token_cache.open_token_cache(ds, model.tokenizer, env)
    other = MultiScaleVQVAE(model.tokenizer.cfg)
    other.load_state_dict(model.tokenizer.state_dict())
    with torch.no_grad():
        other.quant_conv.weight[0, 0, 0, 0] += 1e-3  # one weight differs
    assert token_cache.tokenizer_checksum(other) != token_cache.tokenizer_checksum(model.tokenizer)
    nhwc = MultiScaleVQVAE(model.tokenizer.cfg)
    nhwc.load_state_dict(model.tokenizer.state_dict())
    nhwc.to(memory_format=torch.channels_last)  # training.sft's layout on the CPU: the same weights
    assert token_cache.tokenizer_checksum(nhwc) == token_cache.tokenizer_checksum(model.tokenizer)
    b = token_cache.open_token_cache(ds, other, env)
    assert b.folder != a.folder and b.built > 0
    with pytest.raises(token_cache.TokenCacheError, match="--no-augment"):
        token_cache.open_token_cache(_dataset(manifest, AugmentConfig()), model.tokenizer, env)


def test_sft_with_the_token_cache_trains_as_without(data, tmp_path):
    root, manifest = data
    vq = VQVAEConfig(vocab_size=64, z_channels=8, ch=8, ch_mult=(1, 1, 2), num_res_blocks=1, patch_nums=(1, 2, 4),
                     using_sa=False, using_mid_sa=False)
    tr = dict(depth=2, embed_dim=64, num_heads=2, patch_nums=[1, 2, 4], vocab_size=64, z_channels=8,
              alpha_nums=[0.2, 0.5, 0.7], image_encoder="cnn", encoder_dim=32)
    preset = tmp_path / "preset.json"
    preset.write_text(json.dumps({"tokenizer": vq.to_dict(), "transformer": tr}))
    torch.manual_seed(0)
    MultiScaleVQVAE(vq).save_pretrained(tmp_path / "tok", extra={})
    small = generate(SynthConfig(out=str(tmp_path / "data"), count=20, size=16, seed=3, val_fraction=0.2))

    def run(out, *extra):
        sft.main(["--data", str(small), "--preset", str(preset), "--tokenizer", str(tmp_path / "tok"), "--out",
                  str(out), "--max-steps", "6", "--batch-size", "4", "--no-progress", "--no-augment",
                  "--log-every", "2", *extra])
        from safetensors.torch import load_file
        return load_file(str(out / "final" / "transformer.safetensors"))

    plain = run(tmp_path / "plain", "--no-token-cache")
    cached = run(tmp_path / "cached", "--token-cache")  # 16 triplets: 1.5 epochs, the second from the cache
    for k in plain:
        torch.testing.assert_close(plain[k], cached[k], msg=k)
    assert (small.parent / ".token-cache").is_dir()
    with pytest.raises(SystemExit, match="--token-cache needs --no-augment"):
        sft.main(["--data", str(small), "--preset", str(preset), "--tokenizer", str(tmp_path / "tok"), "--out",
                  str(tmp_path / "x"), "--max-steps", "1", "--token-cache"])
    permuted = run(tmp_path / "palette", "--augment-palette")  # plain crops, palettes permuted: no cache, other data
    assert any(not torch.equal(plain[k], permuted[k]) for k in plain)
    with pytest.raises(SystemExit, match="no --augment-palette"):
        run(tmp_path / "y", "--augment-palette", "--token-cache")


def test_bf16_autocast_steps_with_the_fused_encode():
    """Before the fused encode, the style's and content's encodes ran under the step's autocast and the
    quantizer's fp32 distance matrix refused bf16 features: --precision bf16 failed on its first step (since the
    tokenizer's nearest-code search compares in float32, the three-encode path steps too)."""
    model = _model()
    model.train()
    target, style, content = _triplet(seed=5)
    batch = {"target": target, "style": style, "content": content}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = SFTObjective(model, label_smoothing=0.1, alpha_jitter=0.0, seed=0)(batch)
        unfused = SFTObjective(model, label_smoothing=0.1, alpha_jitter=0.0, seed=0, fuse_encodes=False)(batch)[0]
    assert torch.isfinite(unfused) and abs(float(unfused.detach()) - float(loss.detach())) < 0.05
    loss.backward()
    fp32 = SFTObjective(model, label_smoothing=0.1, alpha_jitter=0.0, seed=0)(batch)[0]
    assert torch.isfinite(loss) and abs(float(loss.detach()) - float(fp32.detach())) < 0.05
