"""stylevar.runtime.inference: the prepared fp32 model computes what the plain one does (up to float rounding),
BatchNorm folding is exact in eval, packed linears equal plain ones, bf16 runs and stays close to fp32,
int8 (removed) is refused saying why, and a prepared model is never saved as a model directory."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from stylevar.models.encoders import resnet18_trunk
from stylevar.runtime.inference import (InferenceConfig, PackedLinear, fuse_conv_bn, packing_available, prepare,
                                        prepared)
from stylevar.pipelines.pipeline import StylePipeline
from tests.conftest import micro_configs


def _resnet_micro():
    vq, tr = micro_configs()
    return StylePipeline.random((vq, dataclasses.replace(tr, image_encoder="resnet18", encoder_dim=512)), seed=5)


def _inputs(batch=2):
    g = torch.Generator().manual_seed(7)
    return torch.rand(batch, 3, 32, 32, generator=g) * 2 - 1, torch.rand(batch, 3, 32, 32, generator=g) * 2 - 1


def test_fused_resnet_matches_batchnorm_in_eval():
    torch.manual_seed(0)
    net = resnet18_trunk()
    for m in net.modules():  # non-trivial running statistics and affine parameters
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    net.eval()
    fused = copy.deepcopy(net)
    assert fuse_conv_bn(fused) == 20  # conv1 + 8 blocks x 2 + 3 downsample shortcuts
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fused.modules())
    x = torch.rand(2, 3, 64, 64) * 2 - 1
    with torch.no_grad():
        torch.testing.assert_close(fused(x), net(x), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_prepared_fp32_generates_what_the_plain_model_generates():
    plain = _resnet_micro().model
    fast = prepare(copy.deepcopy(plain), InferenceConfig())
    assert prepared(fast) == InferenceConfig() and prepared(plain) is None
    c, s = _inputs()
    with torch.no_grad():
        ref, ref_idx = plain.generate_with_indices(c, s, seed=4, top_k=1)
        got, idx = fast.generate_with_indices(c, s, seed=4, top_k=1)
    assert all(torch.equal(a, b) for a, b in zip(idx, ref_idx))
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)


def test_packed_linear_equals_the_linear_it_packs():
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 80)
    x = torch.randn(3, 7, 48)
    with torch.no_grad():
        torch.testing.assert_close(PackedLinear(lin)(x), lin(x), atol=1e-5, rtol=1e-5)
    assert "packed_weight" not in dict(PackedLinear(lin).named_buffers())


@pytest.mark.skipif(not packing_available(torch.bfloat16), reason="oneDNN's bf16 linear needs AVX512BW/VL/DQ or "
                    "AVX-NE-CONVERT; prepare() casts the linears instead on this CPU")
def test_packed_bf16_linear_stays_close_to_the_linear_it_packs():
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 80)
    x = torch.randn(3, 7, 48)
    with torch.no_grad():
        got = PackedLinear(lin, torch.bfloat16)(x)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), lin(x), atol=0.05, rtol=0.02)


def test_a_packed_model_refuses_to_move_off_the_cpu_with_a_clear_error():
    fast = prepare(_resnet_micro().model, InferenceConfig())
    fast.to("cpu").float()  # staying where it is, as it is: fine
    before = {k: (v.device, v.dtype) for k, v in fast.state_dict().items()}
    for move in (lambda m: m.to("meta"), lambda m: m.half()):
        with pytest.raises(ValueError, match="prepared for CPU inference"):
            move(fast)
        assert {k: (v.device, v.dtype) for k, v in fast.state_dict().items()} == before  # nothing moved
    bf16 = prepare(_resnet_micro().model, InferenceConfig(precision="bf16"))
    before = {k: v.dtype for k, v in bf16.state_dict().items()}
    with pytest.raises(ValueError, match="cannot change dtype"):
        bf16.float()
    assert {k: v.dtype for k, v in bf16.state_dict().items()} == before


def test_int8_is_refused_naming_the_valid_precisions_and_why_it_went():
    from stylevar.runtime.inference import PRECISIONS

    assert PRECISIONS == ("auto", "fp32", "bf16")
    with pytest.raises(ValueError, match=r"int8 was removed: .*torchao.* slower than fp32 .*use bf16.*, fp32, bf16"):
        InferenceConfig(precision="int8")
    with pytest.raises(ValueError, match=r"one of auto, fp32, bf16, not 'int4'"):
        InferenceConfig(precision="int4")


def test_bf16_warns_on_a_cpu_without_bf16_units(monkeypatch):
    import stylevar.runtime.inference as inference

    monkeypatch.setattr(inference, "native_cpu_bf16", lambda: False)
    with pytest.warns(RuntimeWarning, match="no native bfloat16"):
        prepare(_resnet_micro().model, InferenceConfig(precision="bf16"))


@pytest.mark.slow
def test_prepared_fp32_packs_every_loop_linear_with_the_gelu_inside_the_first_ffn_product():
    plain = _resnet_micro().model.eval()
    fast = prepare(copy.deepcopy(plain), InferenceConfig())
    blk = fast.blocks[0]
    packed = (blk.attn.q_guide, blk.attn.kv_target, blk.attn.proj, blk.ffn.fc1, blk.ffn.fc2, fast.head)
    assert all(isinstance(m, PackedLinear) and m.dtype == torch.float32 for m in packed)
    x = torch.randn(2, 7, blk.ffn.fc1.in_features)
    for before, after in zip(plain.blocks, fast.blocks):
        assert after.ffn.fc1.post_op == ("gelu", "tanh") and isinstance(after.ffn.act, torch.nn.Identity)
        with torch.no_grad():
            torch.testing.assert_close(after.ffn(x), before.ffn(x), rtol=1e-5, atol=1e-6)
    unpacked = prepare(copy.deepcopy(plain), InferenceConfig(pack_linears=False))
    assert type(unpacked.blocks[0].ffn.fc1) is torch.nn.Linear and isinstance(unpacked.blocks[0].ffn.act, torch.nn.GELU)


def test_bf16_runs_the_loop_in_bf16_and_keeps_the_tokens_close():
    plain = _resnet_micro().model
    fast = prepare(copy.deepcopy(plain), InferenceConfig(precision="bf16"))
    fc1 = fast.blocks[0].ffn.fc1  # packed where oneDNN runs bf16 on this CPU, else a linear cast to bf16
    assert isinstance(fc1, PackedLinear) == packing_available(torch.bfloat16)
    assert fast.loop_autocast_dtype == torch.bfloat16
    assert (fc1.dtype if isinstance(fc1, PackedLinear) else fc1.weight.dtype) == torch.bfloat16
    assert fast.tokenizer.quantize.embedding.weight.dtype == torch.float32  # the codebook search stays fp32
    c, s = _inputs()
    with torch.no_grad():
        images, idx = fast.generate_with_indices(c, s, seed=0)
        plain_images, plain_idx = plain.generate_with_indices(c, s, seed=0)
    assert images.dtype == torch.float32 and images.shape == plain_images.shape
    agreement = torch.cat([(a == b).flatten() for a, b in zip(idx, plain_idx)]).float().mean()
    assert agreement > 0.9, agreement


def test_prepared_models_are_not_saved_and_not_prepared_twice(tmp_path):
    pipe = StylePipeline.random(micro_configs(), seed=1)
    prepare(pipe.model)
    with pytest.raises(ValueError, match="prepared for inference"):
        pipe.save_pretrained(tmp_path / "m")
    with pytest.raises(ValueError, match="already prepared"):
        prepare(pipe.model)
    with pytest.raises(ValueError, match="precision"):
        InferenceConfig(precision="int4")


@pytest.mark.slow
def test_bf16_autocast_on_the_cpu_runs_the_whole_pipeline(tmp_path):
    """`from_pretrained(autocast_dtype="bf16")` on the CPU: the tokenizer's nearest-code search gets bf16 latents
    under autocast and compares them in float32 with the codebook (it used to fail with a dtype mismatch)."""
    from PIL import Image

    pipe = StylePipeline.random(micro_configs(), seed=3)
    pipe.save_pretrained(tmp_path / "m")
    bf16 = StylePipeline.from_pretrained(tmp_path / "m", device="cpu", autocast_dtype="bf16")
    assert bf16.model.autocast_dtype == torch.bfloat16
    content, style = Image.new("RGB", (40, 30), (200, 40, 10)), Image.new("RGB", (32, 32), (10, 90, 200))
    out = bf16(content, style, seed=0)
    assert out.size == (40, 30)
    codes = bf16.model.tokenizer.quantize.nearest(torch.randn(5, bf16.config.tokenizer.z_channels).bfloat16())
    assert codes.dtype == torch.int64 and codes.shape == (5,)
