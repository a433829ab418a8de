"""Stochastic depth (`StyleVARConfig.drop_path_rate`, `stylevar.models.transformer.block.drop_path_factors`): the
reference's schedule, training only; off (rate 0) and in eval mode the computation is today's bit for bit."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from stylevar.config import StyleVARConfig, presets, reference_drop_path_rate
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.models.transformer import StyleVAR
from stylevar.models.transformer.block import drop_path_factors
from stylevar.models.transformer.naive import naive_teacher_forcing_logits
from tests.conftest import micro_configs

pytestmark = pytest.mark.usefixtures("one_thread")


def _pair(batch: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(batch, 3, 32, 32, generator=g) * 2 - 1, torch.rand(batch, 3, 32, 32, generator=g) * 2 - 1


def _models(rate: float):
    """The micro model without drop path, and the same weights with ``rate``."""
    vq_cfg, tr_cfg = micro_configs()
    plain = StylePipeline.random((vq_cfg, tr_cfg), seed=0).model
    dropping = StyleVAR(dataclasses.replace(tr_cfg, depth=4, drop_path_rate=rate), plain.tokenizer)
    plain4 = StyleVAR(dataclasses.replace(tr_cfg, depth=4), plain.tokenizer)
    torch.manual_seed(1)
    plain4.reset_parameters()
    with torch.no_grad():  # open the gates (they start near 0: blocks near identity), so a drop shows
        for blk in plain4.blocks:
            blk.ada_lin[1].bias[: 2 * tr_cfg.embed_dim].fill_(1.0)
    dropping.load_state_dict(plain4.state_dict())
    return plain4, dropping


def test_presets_train_as_the_reference_and_old_configs_read_as_off():
    for name, depth in (("d16", 16), ("d20", 20), ("d24", 24), ("d30", 30)):
        cfg = presets(name)[1]
        assert cfg.drop_path_rate == pytest.approx(0.1 * depth / 24) == reference_drop_path_rate(depth)
        rates = cfg.drop_path_rates
        assert len(rates) == depth and rates[0] == 0.0 and rates[-1] == pytest.approx(cfg.drop_path_rate)
        assert all(b - a == pytest.approx(cfg.drop_path_rate / (depth - 1)) for a, b in zip(rates, rates[1:]))
    assert presets("tiny")[1].drop_path_rate == 0.0  # the demo recipe's shapes: unchanged
    ref = StyleVARConfig.from_reference({"patch_nums": [1, 2, 3], "V": 64, "Cvae": 8, "depth": 8})
    assert ref.drop_path_rate == pytest.approx(0.1 * 8 / 24)
    # a config.json written before the field existed (the shipped demo model's) reads as off
    old = {k: v for k, v in presets("d20")[1].to_dict().items() if k != "drop_path_rate"}
    assert StyleVARConfig.from_dict(old).drop_path_rate == 0.0
    with pytest.raises(ValueError, match="drop_path_rate"):
        StyleVARConfig(drop_path_rate=1.0)


def test_the_rate_is_recorded_in_config_json(tmp_path):
    _, dropping = _models(0.3)
    folder = StylePipeline.from_models(dropping).save_pretrained(tmp_path / "m")
    assert json.loads((folder / "config.json").read_text())["transformer"]["drop_path_rate"] == 0.3
    loaded = StylePipeline.from_pretrained(folder, device="cpu").model
    assert [b.drop_path for b in loaded.blocks] == pytest.approx([0.0, 0.1, 0.2, 0.3])


def test_eval_and_generation_are_bit_identical_with_drop_path():
    plain, dropping = _models(0.5)
    plain.eval(), dropping.eval()
    c, s = _pair()
    idx = plain.tokenizer.encode_indices(c)
    with torch.no_grad():
        assert torch.equal(plain.teacher_forcing_logits(c, s, idx), dropping.teacher_forcing_logits(c, s, idx))
    assert torch.equal(plain.generate(c, s, seed=3, top_k=5), dropping.generate(c, s, seed=3, top_k=5))


def test_rate_zero_trains_as_before_and_draws_no_random_numbers():
    plain, _ = _models(0.5)
    plain.train()
    c, s = _pair()
    idx = plain.tokenizer.encode_indices(c)
    state = torch.get_rng_state()
    train_logits = plain.teacher_forcing_logits(c, s, idx)
    assert torch.equal(torch.get_rng_state(), state), "rate 0 consumes no random numbers"
    with torch.no_grad():  # the micro model has no BatchNorm and no dropout: train mode computes eval's logits
        assert torch.equal(train_logits, plain.eval().teacher_forcing_logits(c, s, idx))
        torch.testing.assert_close(train_logits, naive_teacher_forcing_logits(plain, c, s, idx))


def test_training_with_drop_path_differs_repeats_with_the_seed_and_survives_checkpointing():
    _, dropping = _models(0.5)
    dropping.train()
    c, s = _pair(batch=8)
    idx = dropping.tokenizer.encode_indices(c)

    def loss_and_grads(checkpointing: bool):
        dropping.zero_grad(set_to_none=True)
        dropping.activation_checkpointing = checkpointing
        torch.manual_seed(7)
        loss = dropping.teacher_forcing_logits(c, s, idx).logsumexp(-1).mean()
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in dropping.named_parameters() if p.grad is not None}

    a, grads_a = loss_and_grads(False)
    b, grads_b = loss_and_grads(True)
    assert torch.equal(a, b)
    for n in grads_a:
        torch.testing.assert_close(grads_a[n], grads_b[n], msg=n)
    with torch.no_grad():
        assert not torch.equal(a, dropping.eval().teacher_forcing_logits(c, s, idx).logsumexp(-1).mean())


class _Zero(torch.nn.Module):
    """A branch that contributes nothing (the attention's or the FFN's stand-in)."""

    def forward(self, h_BLC, *args):
        return torch.zeros_like(h_BLC)


def _branch_factors(block, x_BLC, mod, guide, mask, which: str, samples: int) -> torch.Tensor:
    """(samples, B) factors each row's ``which`` branch was multiplied by in training, the other branch zero."""
    zero = _Zero()
    other = "ffn" if which == "attn" else "attn"
    kept = getattr(block, which)
    block.eval()
    with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
        guide = guide._replace(q_BHXc=block.queries(guide.style_ln_BSlC, guide.content_ln_BlC, mod))
        mp.setattr(block, other, zero)
        full_BLC = block(x_BLC, mod, guide, mask) - x_BLC  # the branch, undropped
        block.train()
        out = []
        for _ in range(samples):
            delta_BLC = block(x_BLC, mod, guide, mask) - x_BLC
            out.append((delta_BLC * full_BLC).sum((1, 2)) / full_BLC.square().sum((1, 2)))
    assert getattr(block, which) is kept
    return torch.stack(out)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["attn", "ffn"])
def test_each_block_drops_its_rows_at_its_rate_and_scales_the_kept_ones(which):
    from stylevar.models.transformer.block import Guide

    _, model = _models(0.6)  # rates 0, 0.2, 0.4, 0.6
    c, s = _pair(batch=64)
    with torch.no_grad():
        cond = model.condition(c, s)
        x_BLC = torch.randn(64, model.cfg.num_tokens, model.cfg.embed_dim, generator=torch.Generator().manual_seed(0))
        guide = Guide(model.stream_alphas(cond, model.blend_alphas()), cond.style_ln_BSLC, cond.content_ln_BLC)
    torch.manual_seed(0)
    for block, p in zip(model.blocks, (0.0, 0.2, 0.4, 0.6)):
        assert block.drop_path == pytest.approx(p)
        mod = block.modulation(cond.adaln())
        factors = _branch_factors(block, x_BLC, mod, guide, model.stream_mask(1), which, samples=40).flatten()
        dropped = factors.abs() < 1e-4
        kept = factors[~dropped]
        torch.testing.assert_close(kept, torch.full_like(kept, 1 / (1 - p)), rtol=1e-4, atol=1e-4)
        n = factors.numel()  # 2560 rows: 4 standard deviations of the binomial rate
        rate = float(dropped.float().mean())
        assert abs(rate - p) <= 4 * (p * (1 - p) / n) ** 0.5 + 1e-9, (p, rate)


def test_drop_path_factors():
    x = torch.ones(20000, 3, 2)
    state = torch.get_rng_state()
    assert torch.equal(drop_path_factors(20000, 0.0, x), torch.ones(20000, 1, 1))
    assert torch.equal(torch.get_rng_state(), state), "rate 0 draws nothing"
    torch.manual_seed(0)
    rows = drop_path_factors(20000, 0.25, x)
    assert rows.shape == (20000, 1, 1) and rows.dtype == x.dtype
    torch.testing.assert_close(torch.unique(rows), torch.tensor([0.0, 1 / 0.75]))
    assert abs(float((rows == 0).float().mean()) - 0.25) < 0.015
    torch.manual_seed(0)
    assert torch.equal(drop_path_factors(20000, 0.25, x), rows), "torch's global generator, one draw per row"
