"""Several styles blended by weight, styles confined to masks, and style guidance: the model
and the pipeline.

Exactness: each new option at its neutral value computes what the plain model computes (same seed,
identical tokens); the naive reference implements the same per-token blend.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from PIL import Image

from stylevar.config import GenerationConfig

from stylevar.pipelines.pipeline import StyleMix, StylePipeline
from stylevar.models.transformer import StyleBlend
from stylevar.models.sampling import make_generators
from stylevar.models.transformer.naive import naive_sample_tokens, naive_teacher_forcing_logits

pytestmark = pytest.mark.slow  # the fast lane (-m "not slow") leaves this file out


def images(n: int, seed: int, size: int = 32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, size, size, generator=g) * 2 - 1


@pytest.fixture(scope="module")
def model(micro_pipeline):
    """The micro model with its AdaLN and attention weights drawn large: a fresh model starts with its blocks
    close to identity, where the style barely reaches the logits and a test of style options tells little."""
    m = copy.deepcopy(micro_pipeline.model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for blk in m.blocks:
            for lin in (blk.ada_lin[1], blk.attn.proj, blk.attn.q_guide):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * 0.15)
    return m


CONTENT, STYLE_A, STYLE_B = images(2, 1), images(2, 2), images(2, 3)
SAMPLING = {"top_k": 20, "top_p": 0.95}


def tokens(model, style, seed=7, **kw) -> list[torch.Tensor]:
    _, idx = model.generate_with_indices(CONTENT, style, seed=seed, **SAMPLING, **kw)
    return idx


def assert_same_tokens(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def left_half(B: int, S: int = 1, size: int = 32) -> torch.Tensor:
    m = torch.zeros(B, S, size, size)
    m[..., : size // 2] = 1
    return m


@pytest.mark.slow
def test_one_style_blend_is_the_single_style(model):
    assert_same_tokens(tokens(model, StyleBlend([STYLE_A])), tokens(model, STYLE_A))


@pytest.mark.slow
def test_all_white_mask_is_no_mask(model):
    plain = tokens(model, STYLE_A)
    assert_same_tokens(tokens(model, StyleBlend([STYLE_A], masks_BSHW=torch.ones(2, 1, 32, 32))), plain)
    two = StyleBlend([STYLE_A, STYLE_B], torch.tensor([0.6, 0.4]))
    white = StyleBlend([STYLE_A, STYLE_B], torch.tensor([0.6, 0.4]), torch.ones(2, 2, 17, 23))
    assert_same_tokens(tokens(model, white), tokens(model, two))


@pytest.mark.slow
def test_weights_one_zero_compute_the_first_style(model):
    """The model itself (two streams, one at weight 0): the first style's logits; the pipeline drops
    zero-weight styles (test_style_mix_pipeline), which makes the tokens identical."""
    idx = model.tokenizer.encode_indices(CONTENT)
    with torch.no_grad():
        alone = model.teacher_forcing_logits(CONTENT, STYLE_A, idx)
        mixed = model.teacher_forcing_logits(CONTENT, StyleBlend([STYLE_A, STYLE_B], torch.tensor([1.0, 0.0])), idx)
    torch.testing.assert_close(mixed, alone, atol=1e-5, rtol=0)
    cond = model.condition(CONTENT, StyleBlend([STYLE_A, STYLE_B], torch.tensor([1.0, 0.0])))
    torch.testing.assert_close(cond.cond_BD, model.condition(CONTENT, STYLE_A).cond_BD, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_guidance_zero_is_the_plain_model(model):
    plain = tokens(model, STYLE_A)
    assert_same_tokens(tokens(model, STYLE_A, guidance=0.0), plain)
    assert not all(torch.equal(a, b) for a, b in zip(tokens(model, STYLE_A, guidance=3.0), plain))


def test_guidance_acts_only_where_a_style_applies(model):
    """A style masked out everywhere leaves the content alone: guidance there changes nothing."""
    off = StyleBlend([STYLE_A], masks_BSHW=torch.zeros(2, 1, 32, 32))
    assert_same_tokens(tokens(model, off, guidance=4.0), tokens(model, off))


def test_unstyled_pass_is_the_content_as_its_own_style(model):
    cond = model.condition(CONTENT, StyleBlend([STYLE_A, STYLE_B]), unstyled=True).unstyled()
    ref = model.condition(CONTENT, CONTENT)
    assert torch.equal(cond.cond_BD, ref.cond_BD)
    assert cond.num_styles == 2 and all(torch.equal(s, ref.style_ln_BSLC[:, 0]) for s in cond.style_ln_BSLC.unbind(1))
    with pytest.raises(ValueError, match="unstyled=True"):
        model.condition(CONTENT, STYLE_A).unstyled()


def test_shares_per_token(model):
    pn = model.cfg.patch_nums
    masks = torch.cat([left_half(1), 1 - left_half(1)], 1)  # A left, B right
    shares = StyleBlend([STYLE_A[:1], STYLE_B[:1]], torch.tensor([0.9, 0.1]), masks).shares(pn)
    last = shares[0, :, -pn[-1] ** 2:].view(2, pn[-1], pn[-1])  # finest scale
    assert torch.equal(last[0, :, : pn[-1] // 2], torch.ones(pn[-1], pn[-1] // 2))  # A alone, fully, on the left
    assert torch.equal(last[1, :, pn[-1] // 2:], torch.ones(pn[-1], pn[-1] // 2))  # B alone on the right
    assert torch.allclose(shares[0, :, 0], torch.tensor([0.9, 0.1]))  # 1x1 scale: both halves, by weight
    unmasked = StyleBlend([STYLE_A[:1], STYLE_B[:1]], torch.tensor([3.0, 1.0])).shares(pn)
    assert torch.allclose(unmasked, torch.tensor([0.75, 0.25]).view(1, 2, 1).expand_as(unmasked))
    soft = StyleBlend([STYLE_A[:1]], masks_BSHW=torch.full((1, 1, 32, 32), 0.25)).shares(pn)
    assert torch.allclose(soft, torch.full_like(soft, 0.25))  # a grey mask: a quarter of the style


def test_naive_reference_blends_per_token_the_same(model):
    blend = StyleBlend([STYLE_A, STYLE_B], torch.tensor([0.7, 0.3]), torch.cat([left_half(2), 1 - left_half(2)], 1))
    idx = model.tokenizer.encode_indices(CONTENT)
    with torch.no_grad():
        fast = model.teacher_forcing_logits(CONTENT, blend, idx)
    torch.testing.assert_close(naive_teacher_forcing_logits(model, CONTENT, blend, idx), fast, atol=1e-4, rtol=0)
    cond = model.condition(CONTENT, blend)
    f_fast, i_fast = model.sample_tokens(cond, make_generators(3, 2, CONTENT.device), model.blend_alphas(),
                                         GenerationConfig(top_k=1, top_p=0.0))
    f_naive, i_naive = naive_sample_tokens(model, cond, make_generators(3, 2, CONTENT.device), model.blend_alphas(),
                                           1, 0.0)
    assert_same_tokens(i_fast, i_naive)
    torch.testing.assert_close(f_fast, f_naive, atol=1e-4, rtol=0)


def test_mask_confines_the_style(model):
    """Left-half mask: the right half's finest tokens are what the content-only blend (alpha 0) draws."""
    blend = StyleBlend([STYLE_A], masks_BSHW=left_half(2))
    cond = model.condition(CONTENT, blend)
    alpha = model.stream_alphas(cond, model.blend_alphas())[:, 0, :, 0]  # (B, L)
    n = model.cfg.patch_nums[-1]
    fine = alpha[:, -n * n:].view(2, n, n)
    assert torch.equal(fine[:, :, n // 2:], torch.zeros(2, n, n // 2))
    assert torch.allclose(fine[:, :, : n // 2], torch.full((2, n, n // 2), model.cfg.alpha_nums[-1]))


@pytest.mark.parametrize("kwargs, message", [
    ({"weights_BS": torch.tensor([1.0, -1.0])}, ">= 0"),
    ({"weights_BS": torch.tensor([0.0, 0.0])}, "not all 0"),
    ({"weights_BS": torch.tensor([1.0, 1.0, 1.0])}, "expected 2 per row"),
    ({"masks_BSHW": torch.ones(2, 1, 8, 8)}, "style masks"),
    ({"masks_BSHW": torch.full((2, 2, 8, 8), 1.5)}, r"\[0, 1\]"),
])
def test_blend_refuses_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StyleBlend([STYLE_A, STYLE_B], **kwargs)


def test_guidance_must_be_finite_and_not_negative(model):
    for bad in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="guidance"):
            model.generate(CONTENT, STYLE_A, guidance=bad)


# ---- the pipeline: PIL in and out --------------------------------------------------------------------------
def pil(seed: int, size: tuple[int, int] = (40, 30)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")


C_IMG, A_IMG, B_IMG = pil(1), pil(2, (24, 36)), pil(3)
WHITE = Image.new("L", (13, 9), 255)  # any size: resized to the content's


@pytest.fixture(scope="module")
def pipe(model):
    return StylePipeline.from_models(model)


def same(a: Image.Image, b: Image.Image) -> bool:
    return a.size == b.size and np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_pipeline_neutral_options_give_the_plain_output(pipe, resize="pad"):  # pad: masks are fitted as the content
    plain = pipe(C_IMG, A_IMG, seed=3, resize=resize, **SAMPLING)
    assert same(pipe(C_IMG, [A_IMG], seed=3, resize=resize, **SAMPLING), plain)
    assert same(pipe(C_IMG, [A_IMG, B_IMG], style_weights=[1, 0], seed=3, resize=resize, **SAMPLING), plain)
    assert same(pipe(C_IMG, [A_IMG], style_masks=[WHITE], seed=3, resize=resize, **SAMPLING), plain)
    assert same(pipe(C_IMG, A_IMG, guidance=0.0, seed=3, resize=resize, **SAMPLING), plain)
    assert not same(pipe(C_IMG, [A_IMG, B_IMG], seed=3, resize=resize, **SAMPLING), plain)


def test_pipeline_batches_masked_and_unmasked_rows(pipe):
    """A row without masks batched beside a masked one computes what it computes alone."""
    half = Image.new("L", (40, 30), 0)
    half.paste(255, (0, 0, 20, 30))
    rows = pipe.stylize_batch([C_IMG, C_IMG], [StyleMix((A_IMG, B_IMG), (0.5, 0.5)),
                                               StyleMix((A_IMG, B_IMG), (0.5, 0.5), (half, WHITE))],
                              seeds=[1, 2], **SAMPLING)
    alone = pipe.stylize_batch([C_IMG], [StyleMix((A_IMG, B_IMG), (0.5, 0.5))], seeds=[1], **SAMPLING)
    assert np.abs(np.asarray(rows[0], dtype=int) - np.asarray(alone[0], dtype=int)).max() <= 1
    with pytest.raises(ValueError, match="as many styles"):
        pipe.stylize_batch([C_IMG, C_IMG], [A_IMG, StyleMix((A_IMG, B_IMG))], seeds=[1, 2])


@pytest.mark.parametrize("kwargs, message", [
    ({"style": [A_IMG, B_IMG], "style_weights": [1.0]}, "1 weights for 2 style images"),
    ({"style": [A_IMG, B_IMG], "style_masks": [WHITE]}, "1 masks for 2 style images"),
    ({"style": [A_IMG, B_IMG], "style_weights": [0, 0]}, "not all 0"),
    ({"style": [A_IMG] * 5}, "1 to 4 style images"),
    ({"style": [], "style_weights": None}, "1 to 4 style images"),
])
def test_pipeline_refuses_bad_mixes(pipe, kwargs, message):
    with pytest.raises(ValueError, match=message):
        pipe(C_IMG, **kwargs)


def test_masked_out_everywhere_is_the_model_without_the_style(model):
    """Where no style applies, the attention and AdaLN are those of the content as its own style."""
    idx = model.tokenizer.encode_indices(CONTENT)
    off = StyleBlend([STYLE_A, STYLE_B], masks_BSHW=torch.zeros(2, 2, 32, 32))
    with torch.no_grad():
        masked = model.teacher_forcing_logits(CONTENT, off, idx)
        unstyled = model.teacher_forcing_logits(CONTENT, CONTENT, idx)
        styled = model.teacher_forcing_logits(CONTENT, STYLE_A, idx)
    torch.testing.assert_close(masked, unstyled, atol=1e-4, rtol=0)
    assert (styled - unstyled).abs().max() > 1e-2  # the style does reach the logits of this model
    cond = model.condition(CONTENT, StyleBlend([STYLE_A], masks_BSHW=left_half(2)))
    assert cond.adaln_BLD is not None and cond.adaln_BLD.shape == (2, model.cfg.num_tokens, cond.cond_BD.shape[1])
    assert model.condition(CONTENT, StyleBlend([STYLE_A], masks_BSHW=torch.ones(2, 1, 8, 8))).adaln_BLD is None


@pytest.mark.parametrize("weights", [(1e39, 1.0), (1e-320, 0.0), (3e38, 3e38), (float("inf"), 1.0), (-1.0, 2.0), ()])
def test_style_weights_are_checked_as_the_model_computes(weights):
    from stylevar.processing.postprocess import check_style_weights

    with pytest.raises(ValueError, match="float32"):
        check_style_weights(weights)


def test_style_weights_the_model_can_use_pass_unchanged():
    from stylevar.processing.postprocess import check_style_weights

    assert check_style_weights([0.7, 0.3]) == (0.7, 0.3)
    assert check_style_weights([1e30, 1e-30]) == (1e30, 1e-30)
