"""The opt-in colour-statistics variant (`colour_stats`): the style's explicit colour statistics join its AdaLN
embedding. Off it is the published architecture; on it starts as one (zero-initialised) and, once trained,
lets the style's palette reach the first scale's token, which sees the style only through AdaLN."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from stylevar.models.encoders import NUM_COLOUR_STATS, PALETTE_BINS, colour_statistics
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.models.transformer import StyleVAR
from tests.conftest import micro_configs


def _models():
    vq_cfg, tr_cfg = micro_configs()
    plain = StylePipeline.random((vq_cfg, tr_cfg), seed=0).model
    var = StyleVAR(dataclasses.replace(tr_cfg, colour_stats=True), plain.tokenizer)
    var.load_state_dict({**plain.state_dict(), **{f"colour_in.{k}": v for k, v in var.colour_in.state_dict().items()}})
    return plain, var


def _pair(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(2, 3, 32, 32, generator=g) * 2 - 1, torch.rand(2, 3, 32, 32, generator=g) * 2 - 1


def test_statistics_of_known_images():
    flat = torch.tensor([0.2, -0.4, 0.6]).view(1, 3, 1, 1).expand(1, 3, 8, 8)
    stats = colour_statistics(flat)
    assert stats.shape == (1, NUM_COLOUR_STATS)
    torch.testing.assert_close(stats[0, :3], flat[0, :, 0, 0])  # mean
    torch.testing.assert_close(stats[0, 3:6], torch.zeros(3))  # std
    torch.testing.assert_close(stats[0, 6:].view(PALETTE_BINS, 3), flat[0, :, 0, 0].expand(PALETTE_BINS, 3))
    # a grey ramp: the palette runs from dark to light, each bin the mean of its luminance slice
    ramp = torch.linspace(-1, 1, 64).view(1, 1, 8, 8).expand(1, 3, 8, 8)
    palette = colour_statistics(ramp)[0, 6:].view(PALETTE_BINS, 3)
    assert (palette[1:, 0] > palette[:-1, 0]).all()
    torch.testing.assert_close(palette[:, 0], torch.linspace(-1, 1, 64).view(PALETTE_BINS, 8).mean(1))
    # the layout does not matter, only the colours
    shuffled = ramp.flatten(2)[:, :, torch.randperm(64)].view(1, 3, 8, 8)
    torch.testing.assert_close(colour_statistics(shuffled), colour_statistics(ramp))


def test_off_adds_no_weights_and_on_is_recorded(tmp_path):
    plain, var = _models()
    assert plain.colour_in is None and not any(k.startswith("colour_in") for k in plain.state_dict())
    assert {k for k in var.state_dict() if k not in plain.state_dict()} == {"colour_in.weight", "colour_in.bias"}
    loaded = StylePipeline.from_pretrained(StylePipeline.from_models(var).save_pretrained(tmp_path / "m"), device="cpu")
    assert loaded.config.transformer.colour_stats and loaded.model.colour_in is not None


@pytest.mark.slow
def test_zero_initialised_statistics_compute_the_published_model():
    plain, var = _models()
    c, s = _pair(0)
    idx = plain.tokenizer.encode_indices(c)
    with torch.no_grad():
        torch.testing.assert_close(var.teacher_forcing_logits(c, s, idx), plain.teacher_forcing_logits(c, s, idx))
    torch.testing.assert_close(var.generate(c, s, seed=3, top_k=5), plain.generate(c, s, seed=3, top_k=5))


@pytest.mark.slow
def test_trained_statistics_make_the_style_colour_reach_the_logits():
    _, var = _models()
    with torch.no_grad():
        torch.nn.init.normal_(var.colour_in.weight, std=0.5)
    c, s = _pair(1)
    idx = var.tokenizer.encode_indices(c)
    with torch.no_grad():
        base = var.teacher_forcing_logits(c, s, idx)
        # the same style, recoloured: the colour statistics change and so do the first scale's logits
        recoloured = var.teacher_forcing_logits(c, s.flip(1), idx)
    assert not torch.allclose(base[:, :1], recoloured[:, :1])
    # guidance's unstyled pass embeds the content as a style through the same path
    torch.testing.assert_close(var.condition(c, s, unstyled=True).unstyled_BD, var.style_embedding(c))
