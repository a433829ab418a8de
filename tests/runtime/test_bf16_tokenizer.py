"""Precision "bf16" and the tokenizer: which parts run in bf16 where (`bf16_parts`: the decoder on AMX tiles); the
bf16 decoder never changes a token, stays within 2/255 of fp32's pixels on the trained demo model and close on
average on the golden (random-weight) set; at precision fp32 the prepared tokenizer is the plain one."""
from __future__ import annotations

import copy

import pytest
import torch

from stylevar.loaders.convert import load_stylevar, load_vqvae
from stylevar.runtime import inference
from stylevar.runtime.inference import (
    BF16_PARTS,
    InDtype,
    InferenceConfig,
    bf16_parts,
    prepare,
)

TOKENIZER_PARTS = {"tokenizer_decoder", "tokenizer_encoder"}
NATIVE = torch.cpu._is_avx512_bf16_supported()
needs_native = pytest.mark.skipif(not NATIVE, reason="this CPU has no native bf16 (AVX512-BF16): the bound is "
                                                     "one of those units' rounding, not an emulation's")


@pytest.fixture(scope="module")
def golden_model(golden):
    return load_stylevar(golden["stylevar_sd"], golden["tr_cfg"], load_vqvae(golden["vae_sd"], golden["vq_cfg"])).eval()


def _bf16(model, tiles: bool, monkeypatch):
    """``model`` prepared at bf16 as on a CPU with native bf16, with AMX tiles or without."""
    monkeypatch.setattr(inference, "native_cpu_bf16", lambda: True)
    monkeypatch.setattr(inference, "cpu_bf16_tiles", lambda: tiles)
    return prepare(copy.deepcopy(model), InferenceConfig(precision="bf16"))


def test_the_table_runs_the_decoder_in_bf16_only_on_amx_tiles_and_never_the_encoder():
    assert bf16_parts(True) == {"loop", "image_encoders", "tokenizer_decoder"}
    assert bf16_parts(False) == {"loop", "image_encoders"}
    assert set(BF16_PARTS) == bf16_parts(True) | {"tokenizer_encoder"}


def test_amx_tiles_wrap_the_decoder_and_keep_the_encoder_and_quantizer_fp32(golden_model, monkeypatch):
    tok = _bf16(golden_model, True, monkeypatch).tokenizer
    for part in (tok.decoder, tok.post_quant_conv):
        assert isinstance(part, InDtype) and part.dtype == torch.bfloat16
        assert {p.dtype for p in part.parameters()} == {torch.bfloat16}
    for part in (tok.encoder, tok.quant_conv, tok.quantize):
        assert not isinstance(part, InDtype) and {p.dtype for p in part.parameters()} == {torch.float32}


def test_the_encoder_part_wraps_its_convolutions_and_returns_float32(golden, golden_model):
    model = prepare(copy.deepcopy(golden_model), InferenceConfig(precision="bf16"),
                    parts=frozenset({"tokenizer_encoder"}))
    tok = model.tokenizer
    assert all(isinstance(p, InDtype) and p.dtype == torch.bfloat16 for p in (tok.encoder, tok.quant_conv))
    with torch.inference_mode():
        assert tok.latent(golden["data"]["content"]).dtype == torch.float32  # the quantizer's distances: fp32


def test_without_amx_tiles_nothing_of_the_tokenizer_is_bf16(golden_model, monkeypatch):
    model = _bf16(golden_model, False, monkeypatch)
    assert {p.dtype for p in model.tokenizer.parameters()} == {torch.float32}
    assert not any(isinstance(m, InDtype) for m in model.tokenizer.modules())
    assert model.style_encoder.dtype == torch.bfloat16 and model.loop_autocast_dtype == torch.bfloat16


def _decode(model, indices):
    with torch.inference_mode():
        return model.tokenizer.decode_indices(indices).add(1).div(2)  # [0, 1]


def _decoder_difference(model, indices):
    """Largest and mean pixel difference ([0, 1]) between ``model``'s fp32 decode and its bf16 decoder's."""
    bf16 = prepare(copy.deepcopy(model), InferenceConfig(precision="bf16"), parts=frozenset({"tokenizer_decoder"}))
    difference = (_decode(bf16, indices) - _decode(model, indices)).abs()
    return float(difference.max()), float(difference.mean())


@needs_native
def test_the_bf16_decoder_stays_within_2_of_255_on_the_trained_demo_model():
    from benchmarks.bf16_tokenizer import example_images
    from stylevar.pipelines.pipeline import StylePipeline

    model = StylePipeline.from_pretrained(threads="torch").model.eval()
    with torch.inference_mode():
        indices = model.tokenizer.encode_indices(example_images(model.tokenizer.cfg.image_size))
    largest, _ = _decoder_difference(model, indices)
    assert 0 < largest <= 2 / 255, largest * 255


@needs_native
def test_the_bf16_decoder_stays_close_on_average_on_the_golden_set(golden, golden_model):
    """Random weights drive a tenth of the golden pixels past the clamp; their largest difference is wider than
    the trained model's (benchmarks/bf16_tokenizer.py), the mean stays within 2/255."""
    for key in ("content_idx", "style_idx", "target_idx"):
        _, mean = _decoder_difference(golden_model, golden["data"][key])
        assert 0 < mean <= 2 / 255, (key, mean * 255)


def test_the_bf16_decoder_changes_pixels_never_tokens(golden, golden_model):
    fp32_tokenizer = bf16_parts(False)
    before, after = (prepare(copy.deepcopy(golden_model), InferenceConfig(precision="bf16"), parts=parts)
                     for parts in (fp32_tokenizer, fp32_tokenizer | {"tokenizer_decoder"}))
    content, style = golden["data"]["content"], golden["data"]["style"]
    with torch.inference_mode():
        images_a, idx_a = before.generate_with_indices(content, style, seed=3)
        images_b, idx_b = after.generate_with_indices(content, style, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(idx_a, idx_b))
    assert not torch.equal(images_a, images_b)


def test_prepared_fp32_tokenizer_is_the_plain_one(golden, golden_model):
    """Bit for bit in the plain layout; in channels-last (another convolution order) the same tokens and pixels
    equal up to float rounding."""
    images = golden["data"]["content"]
    with torch.inference_mode():
        idx, f_hats = golden_model.tokenizer.encode(images)
        pixels = golden_model.tokenizer.decode_fhat(f_hats[-1])
        for channels_last in (False, True):
            tok = prepare(copy.deepcopy(golden_model), InferenceConfig(channels_last=channels_last)).tokenizer
            assert not any(isinstance(m, InDtype) for m in tok.modules())
            fast_idx, fast_f_hats = tok.encode(images)
            assert all(torch.equal(a, b) for a, b in zip(idx, fast_idx))
            fast_pixels = tok.decode_fhat(f_hats[-1])
            if channels_last:
                torch.testing.assert_close(fast_pixels, pixels, rtol=0, atol=1e-4)
            else:
                assert torch.equal(fast_f_hats[-1], f_hats[-1]) and torch.equal(fast_pixels, pixels)
