"""The tokenizer's space-to-channel variant (`VQVAEConfig.space_to_channel`): the config round trip, saving and
loading, its sizes, and `widen_to_space_to_channel`, whose twin starts out as the original tokenizer on the
image shrunk 2 x 2 and upsampled (nearest) back."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from stylevar.config import PRESETS, VQVAEConfig
from stylevar.models.tokenizer import MultiScaleVQVAE
from stylevar.models.tokenizer.autoencoder import widen_to_space_to_channel

TOK = dict(vocab_size=64, z_channels=8, ch=8, ch_mult=[1, 2], num_res_blocks=1, patch_nums=[1, 2, 4],
           using_sa=False, using_mid_sa=False, norm_groups=4)  # 8 px; 16 px at space-to-channel 2
DEMO_CONFIG = Path(__file__).resolve().parents[2] / "stylevar" / "assets" / "demo" / "config.json"


def _model(space_to_channel: int, seed: int = 0) -> MultiScaleVQVAE:
    torch.manual_seed(seed)
    return MultiScaleVQVAE(VQVAEConfig.from_dict({**TOK, "space_to_channel": space_to_channel})).eval()


def _images(side: int, seed: int = 1) -> torch.Tensor:
    return torch.rand(2, 3, side, side, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def test_sizes_and_config_round_trip():
    one, two = VQVAEConfig.from_dict(TOK), VQVAEConfig.from_dict({**TOK, "space_to_channel": 2})
    assert (one.downsample, one.image_size) == (2, 8)
    assert (two.downsample, two.image_size) == (4, 16)  # the same 4 x 4 latent from a 2x larger image
    assert VQVAEConfig.from_dict(two.to_dict()) == two and two.to_dict()["space_to_channel"] == 2


def test_published_configs_without_the_key_load_at_one():
    for name in PRESETS:
        assert VQVAEConfig.preset(name).space_to_channel == 1
    section = json.loads(DEMO_CONFIG.read_text())["tokenizer"]  # a config.json written before the field existed
    assert "space_to_channel" not in section
    assert VQVAEConfig.from_dict(section).space_to_channel == 1


def test_save_and_load_keep_the_variant_and_its_outputs(tmp_path):
    model = _model(2)
    model.save_pretrained(tmp_path / "tok")
    assert json.loads((tmp_path / "tok" / "config.json").read_text())["tokenizer"]["space_to_channel"] == 2
    loaded = MultiScaleVQVAE.from_pretrained(tmp_path / "tok")
    assert loaded.cfg == model.cfg
    assert loaded.encoder.conv_in.in_channels == 12 and loaded.decoder.conv_out.out_channels == 12
    x = _images(16)
    with torch.no_grad():
        assert torch.equal(loaded(x).recon, model(x).recon)
    assert [torch.equal(a, b) for a, b in zip(loaded.encode_indices(x), model.encode_indices(x))] == [True] * 3


def test_the_variant_refuses_images_of_the_plain_size():
    with pytest.raises(ValueError, match=r"expected images \(B, 3, 16, 16\)"):
        _model(2).encode_indices(_images(8))


def test_widened_encoder_sees_the_2x2_mean_image():
    small, wide = _model(1), _model(2, seed=5)
    wide.load_state_dict(widen_to_space_to_channel(small.state_dict(), 2))
    x = _images(16)
    with torch.no_grad():
        torch.testing.assert_close(wide.encoder(x), small.encoder(F.avg_pool2d(x, 2)), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(wide.latent(x), small.latent(F.avg_pool2d(x, 2)), atol=1e-5, rtol=1e-5)


def test_widened_decoder_is_the_nearest_upsampled_original():
    small, wide = _model(1), _model(2, seed=5)
    wide.load_state_dict(widen_to_space_to_channel(small.state_dict(), 2))
    z = torch.randn(2, TOK["z_channels"], 4, 4, generator=torch.Generator().manual_seed(2))
    indices = small.encode_indices(_images(8))
    with torch.no_grad():
        torch.testing.assert_close(wide.decoder(z), F.interpolate(small.decoder(z), scale_factor=2, mode="nearest"))
        torch.testing.assert_close(wide.decode_indices(indices),
                                   F.interpolate(small.decode_indices(indices), scale_factor=2, mode="nearest"))


def test_widening_changes_only_the_stem_and_the_head():
    sd = _model(1).state_dict()
    widened = widen_to_space_to_channel(sd, 2)
    changed = sorted(k for k in sd if not torch.equal(sd[k], widened[k]) or sd[k].shape != widened[k].shape)
    assert changed == ["decoder.conv_out.bias", "decoder.conv_out.weight", "encoder.conv_in.weight"]
    assert set(widened) == set(sd)
