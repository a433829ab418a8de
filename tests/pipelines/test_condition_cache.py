"""The pipeline's condition cache (stylevar.pipelines.conditions): a style repeated in a batch or across calls is
encoded once, the pictures are the ones the model's own condition gives, and the cache is bounded and follows the
model."""
from __future__ import annotations

import pytest
import torch
from PIL import Image

from stylevar.models.tokenizer import MultiScaleVQVAE
from stylevar.models.transformer import StyleBlend
from stylevar.pipelines.conditions import ConditionCache, cached_condition
from stylevar.pipelines.pipeline import StylePipeline
from tests.conftest import micro_configs


def image(seed: int, size=(40, 28)) -> Image.Image:
    g = torch.Generator().manual_seed(seed)
    return Image.fromarray((torch.rand(size[1], size[0], 3, generator=g) * 255).to(torch.uint8).numpy(), "RGB")


@pytest.fixture
def pipe():
    return StylePipeline.random(micro_configs(), seed=3)


@pytest.fixture
def encoded(monkeypatch) -> list[int]:
    """The batch size of every tokenizer encode, whichever model makes it."""
    calls: list[int] = []
    original = MultiScaleVQVAE.encode

    def counted(self, x, *args, **kwargs):
        calls.append(x.shape[0])
        return original(self, x, *args, **kwargs)

    monkeypatch.setattr(MultiScaleVQVAE, "encode", counted)
    return calls


def uncached(pipe: StylePipeline):
    """`StylePipeline.draw`'s ``condition`` that computes every row (`StyleVAR.condition`, nothing shared)."""
    return lambda content, style, unstyled: pipe.model.condition(content, style, unstyled=unstyled)


def test_a_batch_with_one_style_encodes_it_once_and_the_next_call_not_at_all(pipe, encoded):
    style = image(0)
    first, second = [image(s) for s in (1, 2, 3, 4)], [image(s) for s in (5, 6, 7, 8)]
    got = [pipe.stylize_batch(c, [style] * 4, seeds=[0, 1, 2, 3]) for c in (first, second)]
    assert encoded == [1, 4, 4], "the style once (1 row), then only the contents (4 rows a call)"
    assert pipe.conditions.stats().hits == {"style": 1, "content": 0}
    encoded.clear()
    want = [pipe.stylize_batch(c, [style] * 4, seeds=[0, 1, 2, 3], condition=uncached(pipe)) for c in (first, second)]
    assert encoded == [4, 4, 4, 4], "without the cache every row is encoded"
    assert [im.tobytes() for ims in got for im in ims] == [im.tobytes() for ims in want for im in ims]


def test_a_kept_condition_gives_the_picture_of_no_cache(pipe, encoded):
    style, content = image(10), image(11)
    off = StylePipeline(pipe.model, pipe.config, ConditionCache(0))
    for _ in range(2):  # cold, then the style and content from the cache
        assert pipe(content, style, seed=5, guidance=0.5).tobytes() == off(content, style, seed=5, guidance=0.5).tobytes()
    assert encoded == [1, 1, 1, 1, 1, 1], "the cache encoded each image once; the one keeping nothing, every call"
    assert pipe.conditions.stats().hits == {"style": 1, "content": 1} and off.conditions.stats().entries == 0


def test_a_blends_repeated_styles_are_encoded_once(pipe, encoded):
    g = torch.Generator().manual_seed(0)
    content, a, b = (torch.rand(3, 3, 32, 32, generator=g) * 2 - 1 for _ in range(3))
    a[:], b[:] = a[0], b[0]  # every row the same two styles
    blend = StyleBlend([a, b], torch.tensor([0.3, 0.7]))
    with torch.no_grad():
        want = pipe.model.condition(content, blend)
        got = cached_condition(pipe.model, ConditionCache(0), content, blend)
    assert encoded == [6, 3, 2, 3], "the model encodes 6 style rows and 3 contents; the cache 2 styles, 3 contents"
    for name in ("cond_BD", "sos_B1C", "style_ln_BSLC", "content_ln_BLC"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name), atol=1e-6, rtol=0, msg=name)


def test_a_changed_model_empties_the_cache(pipe, encoded):
    style, content = image(20), image(21)
    pipe(content, style, seed=0)
    pipe(content, style, seed=0)
    assert encoded == [1, 1] and pipe.conditions.stats().entries == 2
    with torch.no_grad():  # a training step's update, in place
        pipe.model.word_embed.weight.add_(0.01)
    pipe(content, style, seed=0)
    assert encoded == [1, 1, 1, 1], "the new weights encode both again"
    pipe.model.autocast_dtype = torch.bfloat16
    pipe(content, style, seed=0)
    assert len(encoded) == 6 and pipe.conditions.stats().entries == 2


def test_cached_condition_equals_the_model_condition(pipe):
    g = torch.Generator().manual_seed(0)
    content, style = (torch.rand(3, 3, 32, 32, generator=g) * 2 - 1 for _ in range(2))
    style[2] = style[0]
    cache = ConditionCache(2**20)
    with torch.no_grad():
        ref = pipe.model.condition(content, style, unstyled=True)
        for _ in range(2):  # cold, then warm
            got = cached_condition(pipe.model, cache, content, style, unstyled=True)
            for name in ("cond_BD", "sos_B1C", "style_ln_BSLC", "content_ln_BLC", "unstyled_BD"):
                torch.testing.assert_close(getattr(got, name), getattr(ref, name), atol=1e-6, rtol=0, msg=name)


def test_cache_is_bounded_in_bytes_and_evicts_the_least_recently_used():
    entry = 4 * 1000  # 1000 float32
    cache = ConditionCache(max_bytes=2 * entry + 10)
    images = torch.arange(4, dtype=torch.float32).view(4, 1, 1, 1).expand(4, 3, 2, 2)
    computed: list[int] = []

    def compute(x):
        computed.append(x.shape[0])
        return (x[:, :1, :1, :1].reshape(-1, 1).expand(-1, 1000).contiguous(),)

    cache.rows("style", (), images[0:1], compute)
    cache.rows("style", (), images[1:2], compute)
    cache.rows("style", (), images[0:1], compute)  # hit: image 0 becomes the most recent
    cache.rows("style", (), images[2:3], compute)  # evicts image 1
    s = cache.stats()
    assert s.entries == 2 and s.bytes == 2 * entry <= s.max_bytes
    cache.rows("style", (), images[0:1], compute)
    assert computed == [1, 1, 1] and cache.stats().hits == {"style": 2}
    cache.rows("style", (), images[1:2], compute)  # evicted earlier: encoded again
    assert computed == [1, 1, 1, 1]


def test_an_entry_holds_its_own_row_not_the_batch():
    cache = ConditionCache(2**20)
    x = torch.arange(4, dtype=torch.float32).view(4, 1, 1, 1).expand(4, 3, 2, 2)
    cache.rows("style", (), x, lambda t: (t.reshape(4, -1).repeat(1, 100),))
    held = {p[0].untyped_storage().nbytes() for p in cache._entries.values()}
    assert held == {12 * 100 * 4} and cache.stats().bytes == 4 * 12 * 100 * 4


def test_zero_bytes_keeps_nothing_but_a_batch_computes_each_image_once():
    cache = ConditionCache(0)
    x = torch.zeros(2, 3, 32, 32)
    computed: list[int] = []
    out = cache.rows("style", (), x, lambda t: (computed.append(len(t)) or t.mean((1, 2, 3)),))
    assert out[0].shape == (2,) and computed == [1]
    assert cache.stats().entries == 0 and cache.stats().misses == {"style": 1}
