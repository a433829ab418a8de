"""The fast paths compute what the plain path computes (fp32, 1e-4)."""
from __future__ import annotations

import pytest
import torch

from stylevar.pipelines.pipeline import StylePipeline
from stylevar.runtime.compile import compile_blocks
from tests.conftest import micro_configs


def _inputs(model, batch=2):
    g = torch.Generator().manual_seed(3)
    c = torch.rand(batch, 3, 32, 32, generator=g) * 2 - 1
    s = torch.rand(batch, 3, 32, 32, generator=g) * 2 - 1
    return c, s, model.tokenizer.encode_indices(torch.rand(batch, 3, 32, 32, generator=g) * 2 - 1)


@pytest.mark.slow
def test_activation_checkpointing_same_loss_and_grads():
    model = StylePipeline.random(micro_configs(), seed=1).model.train()
    c, s, idx = _inputs(model)
    target = torch.cat(idx, 1)

    def grads():
        model.zero_grad(set_to_none=True)
        logits = model.teacher_forcing_logits(c, s, idx)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss_a, g_a = grads()
    model.activation_checkpointing = True
    loss_b, g_b = grads()
    torch.testing.assert_close(loss_a, loss_b, atol=1e-6, rtol=0)
    assert g_a.keys() == g_b.keys()
    for n in g_a:
        torch.testing.assert_close(g_a[n], g_b[n], atol=1e-5, rtol=1e-4, msg=n)


@pytest.mark.slow
def test_compiled_model_matches_plain():
    model = StylePipeline.random(micro_configs(), seed=2).model
    c, s, idx = _inputs(model)
    with torch.no_grad():
        ref_logits = model.teacher_forcing_logits(c, s, idx)
        ref_images, ref_idx = model.generate_with_indices(c, s, seed=4, top_k=1)
    compile_blocks(model)
    with torch.no_grad():
        torch.testing.assert_close(model.teacher_forcing_logits(c, s, idx), ref_logits, atol=1e-4, rtol=0)
        images, out_idx = model.generate_with_indices(c, s, seed=4, top_k=1)
    assert all(torch.equal(a, b) for a, b in zip(out_idx, ref_idx))
    torch.testing.assert_close(images, ref_images, atol=1e-4, rtol=0)
