"""The opt-in content-injection variant: off it is the published architecture, on it starts as one and
learns to use the content's tokens at the target's positions."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from stylevar.pipelines.pipeline import StylePipeline
from stylevar.models.transformer import StyleVAR
from stylevar.models.transformer.naive import naive_generate, naive_teacher_forcing_logits
from tests.conftest import micro_configs


def _pair(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(2, 3, 32, 32, generator=g) * 2 - 1, torch.rand(2, 3, 32, 32, generator=g) * 2 - 1


def _models():
    vq_cfg, tr_cfg = micro_configs()
    plain = StylePipeline.random((vq_cfg, tr_cfg), seed=0).model
    inj = StyleVAR(dataclasses.replace(tr_cfg, content_injection=True), plain.tokenizer)
    inj.load_state_dict({**plain.state_dict(), **{f"content_in.{k}": v for k, v in inj.content_in.state_dict().items()}})
    return plain, inj


def test_off_adds_no_weights_and_on_records_the_option(tmp_path):
    plain, inj = _models()
    assert plain.content_in is None
    assert not any(k.startswith("content_in") for k in plain.state_dict())
    assert {k for k in inj.state_dict() if k not in plain.state_dict()} == {"content_in.weight", "content_in.bias"}
    d = StylePipeline.from_models(inj).save_pretrained(tmp_path / "m")
    loaded = StylePipeline.from_pretrained(d, device="cpu")
    assert loaded.config.transformer.content_injection and loaded.model.content_in is not None


@pytest.mark.slow
def test_zero_initialised_injection_computes_the_published_model():
    plain, inj = _models()
    assert torch.count_nonzero(inj.content_in.weight) == 0
    c, s = _pair()
    idx = plain.tokenizer.encode_indices(c)
    with torch.no_grad():
        torch.testing.assert_close(inj.teacher_forcing_logits(c, s, idx), plain.teacher_forcing_logits(c, s, idx))
    torch.testing.assert_close(inj.generate(c, s, seed=3, top_k=5), plain.generate(c, s, seed=3, top_k=5))


@pytest.mark.slow
def test_trained_injection_changes_the_output_and_every_path_agrees():
    _, inj = _models()
    with torch.no_grad():
        torch.nn.init.normal_(inj.content_in.weight, std=0.5)
    c, s = _pair(1)
    idx = inj.tokenizer.encode_indices(c)
    with torch.no_grad():
        tf = inj.teacher_forcing_logits(c, s, idx)
    # the content now reaches the logits through the inputs: a different content changes them
    c2, _ = _pair(2)
    with torch.no_grad():
        assert not torch.allclose(tf, inj.teacher_forcing_logits(c2, s, idx))
    # the cached generation loop, teacher forcing and the naive transcription compute the same thing
    images, sampled = inj.generate_with_indices(c, s, top_k=1, seed=0)
    with torch.no_grad():
        assert torch.equal(inj.teacher_forcing_logits(c, s, sampled).argmax(-1), torch.cat(sampled, dim=1))
    torch.testing.assert_close(naive_teacher_forcing_logits(inj, c, s, idx), tf, atol=1e-4, rtol=0)
    torch.testing.assert_close(naive_generate(inj, c, s, seed=5, top_k=20), inj.generate(c, s, seed=5, top_k=20),
                               atol=1e-4, rtol=0)


@pytest.mark.slow
def test_injection_gets_gradients_from_zero():
    _, inj = _models()
    c, s = _pair()
    idx = inj.tokenizer.encode_indices(c)
    logits = inj.teacher_forcing_logits(c, s, idx)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.cat(idx, 1).flatten()).backward()
    assert inj.content_in.weight.grad is not None and inj.content_in.weight.grad.abs().sum() > 0
