"""One precision policy (stylevar.utils.precision): the tokenizer's encode, quantizer and decode run in float32 under any
autocast, so an image's condition tokens and a token map's picture are fp32's on every path (the demo model's two
finest scales flipped 0.4% of these noise images' tokens under CPU bf16 autocast; the prepared bf16 precision ran the
tokenizer's convolutions in bf16), and validation's conditions hold the tokens training's encode gives."""
from __future__ import annotations

import copy

import pytest
import torch

from stylevar.models.transformer import StyleVAR
from stylevar.utils.precision import cuda_like_autocast
from stylevar.runtime.inference import InferenceConfig, prepare
from stylevar.loaders.model_dir import DEMO_MODEL_DIR
from training.parts.token_inputs import condition_from_tokens, encode_triplets


@pytest.fixture(scope="module")
def demo() -> StyleVAR:
    return StyleVAR.from_pretrained(DEMO_MODEL_DIR)


def _images(model: StyleVAR, n: int, seed: int) -> torch.Tensor:
    size = model.tokenizer.cfg.image_size
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def _condition_tokens(model: StyleVAR, img: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    maps, f_hats = model.tokenizer.encode(img)
    return maps, model.tokenizer.quantize.condition_tokens(f_hats)


@pytest.mark.parametrize("autocast", [lambda: torch.autocast("cpu", dtype=torch.bfloat16),
                                      lambda: cuda_like_autocast(torch.bfloat16)], ids=["cpu-autocast", "cuda-like"])
def test_condition_tokens_and_pictures_under_bf16_autocast_are_fp32s(demo, autocast):
    img = _images(demo, 4, 0)
    maps, tokens_BLc = _condition_tokens(demo, img)
    with torch.no_grad():
        picture = demo.tokenizer.decode_indices(maps)
        with autocast():
            bf_maps, bf_tokens_BLc = _condition_tokens(demo, img)
            bf_picture = demo.tokenizer.decode_indices(maps)
            residual = demo.tokenizer.quantize.upsampled_residual(1, maps[1], demo.tokenizer.latent_size)
    assert all(torch.equal(a, b) for a, b in zip(bf_maps, maps))
    assert bf_tokens_BLc.dtype == bf_picture.dtype == residual.dtype == torch.float32
    assert torch.equal(bf_tokens_BLc, tokens_BLc) and torch.equal(bf_picture, picture)


def test_the_bf16_precision_keeps_the_condition_tokens_of_fp32(demo):
    """The service's and the command line's precisions (`prepare`): bf16 encodes as fp32 does (channels-last
    layouts round the streams' last bit differently from a plain model: the prepared fp32 is the reference)."""
    img = _images(demo, 4, 1)
    maps, tokens_BLc = _condition_tokens(prepare(copy.deepcopy(demo), InferenceConfig(precision="fp32")), img)
    fast = prepare(copy.deepcopy(demo), InferenceConfig(precision="bf16"))
    fast_maps, fast_tokens_BLc = _condition_tokens(fast, img)
    assert all(torch.equal(a, b) for a, b in zip(fast_maps, maps)) and torch.equal(fast_tokens_BLc, tokens_BLc)


def test_validation_conditions_on_the_tokens_training_encodes(demo):
    """Training encodes the triplet in one fp32 call (`encode_triplets`); validation's teacher forcing lets the model
    encode style and content under the run's autocast: the same token streams."""
    target, style, content = (_images(demo, 2, seed) for seed in (2, 3, 4))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        trained = condition_from_tokens(demo, content, style, encode_triplets(demo.tokenizer, target, style,
                                                                              content)[0])
        validated = demo.condition(content, style)
    assert torch.equal(validated.style_ln_BSLC, trained.style_ln_BSLC)
    assert torch.equal(validated.content_ln_BLC, trained.content_ln_BLC)
