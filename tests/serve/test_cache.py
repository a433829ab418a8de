"""The service's condition cache (the runner's pipeline's, scoped by API key): a repeated reference image is encoded
once, the cached path produces exactly what the uncached pipeline produces, and one key's images are no hit for
another's."""
from __future__ import annotations

import pytest
import torch
from PIL import Image

from serve.engine.batching import Job
from serve.engine.runner import ModelRunner, StylizeTask
from serve.http.metrics import ServiceMetrics
from stylevar.config import DEFAULT_GENERATION
from stylevar.pipelines.conditions import ConditionCache
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.pipelines.request import StyleMix, Stylization, StylizeRequest
from stylevar.processing.postprocess import OutputOptions
from tests.conftest import micro_configs

pytestmark = pytest.mark.slow  # the fast lane (-m "not slow") leaves this file out


def _image(seed: int, size=(40, 28)) -> Image.Image:
    g = torch.Generator().manual_seed(seed)
    arr = (torch.rand(size[1], size[0], 3, generator=g) * 255).to(torch.uint8).numpy()
    return Image.fromarray(arr, "RGB")


def _job(content: Image.Image, style: Image.Image, seeds=(0,)) -> Job:
    item = Stylization(StylizeRequest(), content, StyleMix.of(style), DEFAULT_GENERATION, tuple(seeds),
                       OutputOptions(max_side=1024))
    return Job(key=item.key, rows=len(seeds), payload=StylizeTask(item), deadline=float("inf"))


@pytest.fixture
def pipe():
    return StylePipeline.random(micro_configs(), seed=3)


def _count_calls(monkeypatch, model, name: str) -> list[int]:
    calls: list[int] = []
    original = getattr(model, name)

    def counted(x, *a, **kw):
        calls.append(x.shape[0])
        return original(x, *a, **kw)

    monkeypatch.setattr(model, name, counted)
    return calls


def test_repeated_style_is_encoded_once_and_gives_the_uncached_output(pipe, monkeypatch):
    metrics = ServiceMetrics()
    runner = ModelRunner(pipe, 1024, ConditionCache(64 * 2**20, metrics))
    style_calls = _count_calls(monkeypatch, pipe.model, "style_parts")
    style, c1, c2 = _image(1), _image(2), _image(3)

    first = runner.run([_job(c1, style)])[0][0]
    second = runner.run([_job(c2, style)])[0][0]
    assert style_calls == [1]  # the second request found the style in the cache
    stats = runner.cache.stats()
    assert stats.misses == {"style": 1, "content": 2} and stats.hits == {"style": 1, "content": 0}
    assert 0 < stats.bytes <= stats.max_bytes and stats.entries == 3

    for content, cached in ((c1, first), (c2, second)):
        uncached = pipe.stylize_batch([content], [style], seeds=[0], max_side=1024,
                                      condition=lambda c, s, u: pipe.model.condition(c, s, unstyled=u))[0]
        assert cached.tobytes() == uncached.tobytes()

    text = metrics.render().decode()
    assert 'stylevar_condition_cache_hits_total{kind="style"} 1.0' in text
    assert 'stylevar_condition_cache_misses_total{kind="content"} 2.0' in text
    assert "stylevar_condition_cache_entries 3.0" in text


def test_a_batch_encodes_each_distinct_image_once(pipe, monkeypatch):
    runner = ModelRunner(pipe, 1024, ConditionCache(64 * 2**20))
    style_calls = _count_calls(monkeypatch, pipe.model, "style_parts")
    content_calls = _count_calls(monkeypatch, pipe.model, "content_parts")
    style, c1, c2 = _image(4), _image(5), _image(6)
    out = runner.run([_job(c1, style, seeds=(0, 1)), _job(c2, style), _job(c1, style, seeds=(2,))])
    assert [len(o) for o in out] == [2, 1, 1]
    assert style_calls == [1] and content_calls == [2]  # one style, two distinct contents, 5 rows
    assert runner.cache.stats().misses == {"style": 1, "content": 2}


def test_each_scope_has_its_own_cache_and_a_shared_image_is_encoded_once_a_batch(pipe, monkeypatch):
    """Issue 55, finding 9: the same content sent with another API key is no hit (its timing would tell one client
    what another sent); within one scope it is."""
    runner = ModelRunner(pipe, 1024, ConditionCache(64 * 2**20))
    content_calls = _count_calls(monkeypatch, pipe.model, "content_parts")
    style, content = _image(7), _image(8)

    def job(scope: str) -> Job:
        j = _job(content, style)
        return Job(key=j.key, rows=1, payload=StylizeTask(j.payload.stylization, cache_scope=scope),
                   deadline=float("inf"))

    runner.run([job("a")])
    runner.run([job("b")])
    assert runner.cache.stats().hits == {"style": 0, "content": 0}, "another key's images are not found"
    runner.run([job("a")])
    assert runner.cache.stats().hits == {"style": 1, "content": 1}
    runner.run([job("c"), job("d")])  # two new scopes in one batch: stored for each, computed once
    assert content_calls == [1, 1, 1]


def test_the_service_scopes_the_cache_by_api_key(micro_model_dir):
    import io

    from fastapi.testclient import TestClient

    from serve.http.app import create_app
    from serve.settings import ServeSettings

    def png(image: Image.Image) -> bytes:
        buf = io.BytesIO()
        image.save(buf, "PNG")
        return buf.getvalue()

    files = {"content": ("c.png", png(_image(9)), "image/png"), "style": ("s.png", png(_image(10)), "image/png")}
    settings = ServeSettings(model_dir=micro_model_dir, device=["cpu"], ui=False, warmup=False, api_keys=["k1", "k2"])
    with TestClient(create_app(settings)) as c:
        for key in ("k1", "k2", "k1"):
            assert c.post("/stylize", files=files, headers={"Authorization": f"Bearer {key}"}).status_code == 200
        cache = c.app.state.service.runner.cache
    assert cache.stats().misses == {"style": 2, "content": 2} and cache.stats().hits == {"style": 1, "content": 1}
