"""AdaIN baseline with stand-in weights in the public files' layouts."""
from __future__ import annotations

import math

import pytest
import torch

from stylevar.loaders import weights
from stylevar.baselines.adain import AdaIN, adaptive_instance_norm, channel_mean_std, decoder_layers, vgg_normalised_layers
from stylevar.models.state_dict import WeightMismatchError

# The public files' layouts (pytorch-AdaIN's torch7 conversions): index of every conv in the nn.Sequential
# and its (out, in, k, k) weight shape. vgg_normalised.pth runs to relu5_4; decoder.pth from relu4_1 to RGB.
VGG_NORMALISED_CONVS = {
    0: (3, 3, 1), 2: (64, 3, 3), 5: (64, 64, 3), 9: (128, 64, 3), 12: (128, 128, 3), 16: (256, 128, 3),
    19: (256, 256, 3), 22: (256, 256, 3), 25: (256, 256, 3), 29: (512, 256, 3), 32: (512, 512, 3),
    35: (512, 512, 3), 38: (512, 512, 3), 42: (512, 512, 3), 45: (512, 512, 3), 48: (512, 512, 3),
    51: (512, 512, 3),
}
DECODER_CONVS = {
    1: (256, 512, 3), 5: (256, 256, 3), 8: (256, 256, 3), 11: (256, 256, 3), 14: (128, 256, 3),
    18: (128, 128, 3), 21: (64, 128, 3), 25: (64, 64, 3), 28: (3, 64, 3),
}


def layout(convs: dict[int, tuple[int, int, int]]) -> dict[str, tuple[int, ...]]:
    out = {}
    for i, (cout, cin, k) in convs.items():
        out[f"{i}.weight"], out[f"{i}.bias"] = (cout, cin, k, k), (cout,)
    return out


def write_standin(path, convs, seed, gain=1.0):
    """Random tensors in the given layout: He-scaled weights (times `gain`), small biases."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for key, shape in layout(convs).items():
        if key.endswith("bias"):
            sd[key] = 0.01 * torch.randn(shape, generator=g)
        else:
            sd[key] = torch.randn(shape, generator=g) * gain * math.sqrt(2.0 / math.prod(shape[1:]))
    torch.save(sd, path)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("adain")
    # gain 1.5: relu4_1 features of a few units, so that AdaIN's eps (1e-5) is negligible against their variances
    return (write_standin(root / "vgg_normalised.pth", VGG_NORMALISED_CONVS, 1, gain=1.5),
            write_standin(root / "decoder.pth", DECODER_CONVS, 2))


def images(n: int = 2, size: int = 64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(n, 3, size // 8, size // 8, generator=g)  # smooth-ish images
    return torch.nn.functional.interpolate(low, size=size, mode="bilinear", align_corners=False)


def test_layouts_match_the_public_files():
    assert {k: tuple(v.shape) for k, v in vgg_normalised_layers().state_dict().items()} == layout(VGG_NORMALISED_CONVS)
    assert {k: tuple(v.shape) for k, v in decoder_layers().state_dict().items()} == layout(DECODER_CONVS)


@pytest.mark.slow
def test_adain_normalised_features_carry_the_style_statistics(files):
    adain = AdaIN.from_files(decoder=files[1], encoder=files[0])
    assert adain.encoder_kind == "vgg_normalised" and adain.label == "AdaIN"
    content, style = images(seed=1), images(seed=2)
    f_c, f_s = adain.encode(content), adain.encode(style)
    assert f_c.shape == (2, 512, 8, 8)
    t = adaptive_instance_norm(f_c, f_s)
    t_mean, t_std = channel_mean_std(t, eps=0.0)
    s_mean, s_std = channel_mean_std(f_s, eps=0.0)
    # AdaIN's eps (1e-5, added to the variances) only vanishes where both channels really vary;
    # a channel that is (almost) constant on either image has no std to carry
    alive = ((f_c.flatten(2).var(2) > 0.05) & (f_s.flatten(2).var(2) > 0.05))[..., None, None]
    assert alive.float().mean() > 0.2
    assert torch.allclose(t_mean, s_mean, atol=1e-4)
    assert torch.allclose(t_std[alive], s_std[alive], atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_alpha_zero_decodes_the_content_features_unchanged(files):
    adain = AdaIN.from_files(decoder=files[1], encoder=files[0])
    content, style = images(seed=3), images(seed=4)
    out = adain.stylize(content, style, alpha=0.0)
    expected = adain.decode(adain.encode(content)).clamp(0, 1)
    assert torch.equal(out, expected)
    full = adain.stylize(content, style, alpha=1.0)
    assert full.shape == content.shape and full.min() >= 0 and full.max() <= 1
    assert not torch.allclose(full, out)
    half = adain.stylize(content, style[:1], alpha=0.5)  # one style shared by the batch
    assert half.shape == content.shape


@pytest.mark.slow
def test_paper_variant_uses_torchvision_vgg19(files, tmp_path):
    from torchvision.models import vgg19

    with torch.device("meta"):
        ref = vgg19().state_dict()
    g = torch.Generator().manual_seed(5)
    sd = {k: (torch.randn(v.shape, generator=g) * 0.05 if v.dim() > 1 and v.numel() < 5_000_000 else torch.zeros(v.shape))
          for k, v in ref.items()}
    path = tmp_path / "vgg19-dcbb9e9d.pth"
    torch.save(sd, path)
    adain = AdaIN.from_files(decoder=files[1], encoder="torchvision", torchvision_weights=path)
    assert adain.encoder_kind == "torchvision" and "paper" in adain.label
    assert len(adain.encoder) == 21 and isinstance(adain.encoder[-1], torch.nn.ReLU)
    content, style = images(seed=6), images(seed=7)
    assert adain.encode(content).shape == (2, 512, 8, 8)
    out = adain.stylize(content, style)
    assert out.shape == content.shape
    # exactly the paper's evaluation formula: per-channel statistics with the biased variance (divided by n)
    f_c, f_s = adain.encode(content), adain.encode(style)

    def stats(f):
        flat = f.flatten(2)
        return flat.mean(2)[..., None, None], (flat.var(2, unbiased=False) + 1e-5).sqrt()[..., None, None]

    (mc, sc), (ms, ss) = stats(f_c), stats(f_s)
    with torch.no_grad():
        expected = adain.decode((f_c - mc) / sc * ss + ms).clamp(0, 1)
        unbiased = adain.decode(adaptive_instance_norm(f_c, f_s, unbiased=True)).clamp(0, 1)
    assert torch.equal(out, expected)
    assert not torch.equal(out, unbiased)  # the two variances give different pictures


@pytest.mark.slow
def test_registry_and_bad_files(files, weight_homes):
    sv, _ = weight_homes
    with pytest.raises(weights.MissingWeightError, match="decoder.pth"):
        AdaIN.from_registry()
    sv.mkdir()
    for src in files:
        (sv / src.name).write_bytes(src.read_bytes())
    assert AdaIN.from_registry().encoder_kind == "vgg_normalised"
    with pytest.raises(weights.MissingWeightError, match="vgg19-dcbb9e9d.pth"):
        AdaIN.from_registry("torchvision")
    # a decoder passed where the encoder belongs: every bad key is counted
    with pytest.raises(WeightMismatchError) as e:
        AdaIN.from_files(decoder=files[1], encoder=files[1])
    msg = str(e.value)
    assert "missing keys (30): 0.weight" in msg and "unexpected keys (14): 1.weight" in msg
    assert "wrong shapes (4): 5.weight: file (256, 256, 3, 3) vs expected (64, 64, 3, 3)" in msg
    with pytest.raises(ValueError, match="alpha"):
        AdaIN.from_files(decoder=files[1], encoder=files[0]).stylize(images(), images(), alpha=1.5)
