"""stylevar.inference: the prepared fp32 model computes what the plain one does (up to float rounding),
BatchNorm folding is exact in eval, int8 runs, and a prepared model is never saved as a model directory."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from stylevar.encoders import resnet18_trunk
from stylevar.inference import InferenceConfig, fuse_conv_bn, prepare, prepared
from stylevar.pipeline import StylePipeline
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


def test_int8_runs_and_quantises_the_transformer_linears():
    plain = _resnet_micro().model
    q = prepare(copy.deepcopy(plain), InferenceConfig(precision="int8"))
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    blk = q.blocks[0]
    assert all(isinstance(m, DynamicLinear) for m in (blk.ffn.fc1, blk.ffn.fc2, blk.attn.q_guide, blk.attn.proj, q.head))
    assert isinstance(blk.attn.kv_target, torch.nn.Linear)  # read as a weight by the attention: kept fp32
    c, s = _inputs()
    with torch.no_grad():
        images, idx = q.generate_with_indices(c, s, seed=0)
        plain_idx = plain.generate_with_indices(c, s, seed=0)[1]
    assert images.shape == (2, 3, 32, 32) and torch.isfinite(images).all()
    assert 0 <= images.min() and images.max() <= 1
    assert [t.shape for t in idx] == [t.shape for t in plain_idx]
    assert all(int(t.min()) >= 0 and int(t.max()) < 64 for t in idx)


def test_prepared_models_are_not_saved_and_not_prepared_twice(tmp_path):
    pipe = StylePipeline.random(micro_configs(), seed=1)
    prepare(pipe.model)
    with pytest.raises(ValueError, match="prepared for inference"):
        pipe.save_pretrained(tmp_path / "m")
    with pytest.raises(ValueError, match="already prepared"):
        prepare(pipe.model)
    with pytest.raises(ValueError, match="precision"):
        InferenceConfig(precision="int4")
