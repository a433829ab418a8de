"""Weight-free style measures (`stylevar.metrics.style_fidelity`) on images whose answer is known."""
from __future__ import annotations

import pytest
import torch

from stylevar.metrics.style_fidelity import colour_swd, texture_distance


def _image(seed: int, size: int = 48) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(2, 3, size // 8, size // 8, generator=g)
    return torch.nn.functional.interpolate(low, size=(size, size), mode="bilinear", align_corners=False)


def _noise(seed: int, feature: int, size: int = 64) -> torch.Tensor:
    """A grey texture whose features are about `feature` pixels wide."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(1, 1, size // feature, size // feature, generator=g)
    img = torch.nn.functional.interpolate(low, size=(size, size), mode="bilinear", align_corners=False)
    return img.expand(1, 3, size, size).clone()


def _stripes(period: int, size: int = 64) -> torch.Tensor:
    wave = 0.5 + 0.4 * torch.sin(2 * torch.pi * torch.arange(size).float() / period)
    return wave.view(size, 1).expand(size, size).expand(1, 3, size, size).clone()


def test_identical_images_score_zero():
    a = _image(0)
    torch.testing.assert_close(colour_swd(a, a), torch.zeros(2))
    torch.testing.assert_close(texture_distance(a, a), torch.zeros(2))


def test_colour_distance_sees_a_recolouring_not_a_shift():
    a = _image(1) * torch.tensor([1.0, 0.6, 0.2]).view(1, 3, 1, 1)  # reddish
    shifted = torch.roll(a, shifts=(2, 3), dims=(2, 3))
    recoloured = a.flip(1)  # RGB -> BGR: the same layout, other colours
    swd_shift, swd_recolour = colour_swd(a, shifted), colour_swd(a, recoloured)
    assert (swd_shift < 1e-6).all()  # a shift moves no colour (roll keeps every pixel)
    assert (swd_recolour > 0.05).all() and (swd_recolour > 100 * swd_shift.clamp_min(1e-6)).all()
    # a slight tint is a small distance, a strong one a larger one
    tint = torch.tensor([0.05, 0.0, 0.0]).view(1, 3, 1, 1)
    assert (colour_swd(a, (a + tint).clamp(0, 1)) < colour_swd(a, (a + 4 * tint).clamp(0, 1))).all()
    # images of different sizes compare through their quantiles
    small = torch.nn.functional.interpolate(a, size=(24, 24), mode="nearest")
    assert (colour_swd(a, small) < 0.05).all()


def test_texture_distance_ignores_the_palette_and_sees_the_pattern():
    fine, coarse = _noise(0, 2), _noise(1, 8)
    other_draw = _noise(5, 2)  # the same kind of texture, other random values
    assert float(texture_distance(fine, coarse)) > 0.15
    assert float(texture_distance(fine, other_draw)) < 0.25 * float(texture_distance(fine, coarse))
    # a slightly shifted copy is much closer than another texture
    assert float(texture_distance(fine, torch.roll(fine, 1, dims=2))) < 0.25 * float(texture_distance(fine, coarse))
    # the same pattern in other colours and brightness: the texture measure does not move
    tinted = fine * torch.tensor([0.3, 1.0, 0.6]).view(1, 3, 1, 1) + 0.2
    assert float(texture_distance(fine, tinted)) < 1e-3
    # orientation counts: horizontal against vertical stripes
    stripes = _stripes(8)
    assert float(texture_distance(stripes, stripes.transpose(2, 3))) > 0.2


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="expected"):
        colour_swd(torch.rand(1, 1, 8, 8), torch.rand(1, 1, 8, 8))
    with pytest.raises(ValueError, match="batches differ"):
        texture_distance(torch.rand(2, 3, 8, 8), torch.rand(1, 3, 8, 8))
