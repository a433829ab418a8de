"""The palette step (`stylevar.processing.palette`): Reinhard's moments or the whole colour distribution, off by default,
one config section, per-region with masked style blends."""
from __future__ import annotations

import kornia.color
import pytest
import torch

from stylevar.metrics.style_fidelity import colour_swd
from stylevar.processing.palette import Palette, lab_moments, match_palette
from stylevar.models.transformer import StyleBlend


def _pictures(seed: int = 0):
    """A drawing with a flat region and a ramp, and a style of two colour clusters (style in [-1, 1])."""
    g = torch.Generator().manual_seed(seed)
    drawing = torch.rand(2, 3, 32, 32, generator=g) * 0.3 + 0.5
    drawing[:, :, :12] = torch.tensor([0.6, 0.4, 0.3]).view(1, 3, 1, 1)  # a flat band
    style = torch.where(torch.rand(2, 1, 32, 32, generator=g) < 0.5, torch.tensor([0.1, 0.2, 0.8]).view(1, 3, 1, 1),
                        torch.tensor([0.9, 0.8, 0.1]).view(1, 3, 1, 1))
    style = (style + 0.05 * torch.rand(2, 3, 32, 32, generator=g)).clamp(0, 1)
    return drawing, style * 2 - 1


def test_off_is_the_identity_and_bad_settings_are_refused():
    drawing, style = _pictures()
    assert match_palette(drawing, style, Palette()) is drawing
    for bad in ({"strength": 1.5}, {"strength": float("nan")}, {"strength": 0.5, "method": "hist"},
                {"strength": 0.5, "method": "distribution", "iterations": 0}):
        with pytest.raises(ValueError, match="palette"):
            Palette(**bad)
    with pytest.raises(ValueError, match="unknown fields"):
        Palette.from_dict({"strength": 0.5, "mode": "distribution"})
    cfg = Palette(0.8, "distribution", 4)
    assert Palette.from_dict(cfg.to_dict()) == cfg


def test_moments_take_the_style_mean_and_spread():
    drawing, _ = _pictures()
    g = torch.Generator().manual_seed(2)
    style = (torch.rand(2, 3, 32, 32, generator=g) * 0.3 + torch.tensor([0.2, 0.3, 0.5]).view(1, 3, 1, 1)) * 2 - 1
    out = match_palette(drawing, style, Palette(1.0))
    m_out, s_out = lab_moments(kornia.color.rgb_to_lab(out))
    m_sty, s_sty = lab_moments(kornia.color.rgb_to_lab(style.add(1).mul(0.5)))
    torch.testing.assert_close(m_out, m_sty, atol=1.2, rtol=0)  # Lab units (out-of-gamut colours are clamped)
    torch.testing.assert_close(s_out, s_sty, atol=0, rtol=0.1)


def test_distribution_reaches_the_style_colours_where_moments_cannot():
    drawing, style = _pictures()
    style01 = style.add(1).mul(0.5)
    before = colour_swd(drawing, style01).mean()
    moments = colour_swd(match_palette(drawing, style, Palette(1.0)), style01).mean()
    dist = colour_swd(match_palette(drawing, style, Palette(1.0, "distribution")), style01).mean()
    half = colour_swd(match_palette(drawing, style, Palette(0.5, "distribution")), style01).mean()
    assert dist < 0.5 * moments < before  # two clusters: the moments alone give one blob between them
    assert dist < half < before


def test_distribution_maps_colours_not_positions():
    drawing, style = _pictures()
    cfg = Palette(1.0, "distribution")
    out = match_palette(drawing, style, cfg)
    band = out[:, :, :12].flatten(2)
    assert (band.amax(2) - band.amin(2)).max() < 1e-5  # a flat region stays flat (one colour, one image)
    torch.testing.assert_close(match_palette(drawing, style, cfg), out, rtol=0, atol=0)  # deterministic
    # the same colours anywhere in the picture map the same way: shuffling pixels shuffles the result
    perm = torch.randperm(32 * 32, generator=torch.Generator().manual_seed(1))
    shuffled = drawing.flatten(2)[:, :, perm].view_as(drawing)
    torch.testing.assert_close(match_palette(shuffled, style, cfg).flatten(2), out.flatten(2)[:, :, perm],
                               atol=1e-4, rtol=0)


def test_masked_blend_gives_each_region_its_own_palette():
    drawing, _ = _pictures()
    blue = torch.tensor([0.1, 0.2, 0.8]).view(1, 3, 1, 1).expand(2, 3, 32, 32) * 2 - 1
    yellow = torch.tensor([0.9, 0.8, 0.1]).view(1, 3, 1, 1).expand(2, 3, 32, 32) * 2 - 1
    masks = torch.zeros(2, 2, 32, 32)
    masks[:, 0, :, :16], masks[:, 1, :, 16:] = 1, 1
    out = match_palette(drawing, StyleBlend([blue, yellow], masks_BSHW=masks), Palette(1.0, "distribution"))
    left, right = out[:, :, :, :16].mean((0, 2, 3)), out[:, :, :, 16:].mean((0, 2, 3))
    assert left[2] > left[0] + 0.4 and right[0] > right[2] + 0.4


def test_the_quantiles_are_torch_quantiles_from_one_sort():
    from stylevar.processing.palette import _quantiles

    g = torch.Generator().manual_seed(3)
    levels = torch.linspace(0, 1, 64)
    for n in (1, 2, 63, 4096, 5000):
        x_BNA = torch.randn(2, n, 5, generator=g)
        x_BNA[:, : n // 3] = 0.25  # ties, as a flat region gives
        expected = torch.quantile(x_BNA, levels, dim=1).permute(2, 1, 0)  # (A, B, Q)
        got = _quantiles(x_BNA, levels)
        assert got.shape == expected.shape == (5, 2, 64)
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=4e-6)  # float rounding of the interpolation
