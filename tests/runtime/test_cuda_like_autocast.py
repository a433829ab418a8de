"""CUDA's autocast on the CPU (stylevar.utils.precision): it casts as CUDA does (norms, sums and exp in
float32, matrix products in bf16, float32 regions respected), and under it the pipeline, the service's batcher and an
SFT step run with the attention's queries, keys, values, KV cache and precomputed guide queries in bf16 (CUDA's
float32 layer_norm/normalize once made them float32: ~9 GB of guide queries for 64 rows of d20, cast at every call)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from serve.engine.batching import BatchConfig, Batcher
from serve.engine.runner import ModelRunner, StylizeTask
from stylevar.config import DEFAULT_GENERATION
from stylevar.models.transformer.attention import BlendedAttention, KVCache
from stylevar.models.transformer.block import Block
from stylevar.pipelines.conditions import ConditionCache
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.pipelines.request import StyleMix, Stylization, StylizeRequest
from stylevar.processing.postprocess import OutputOptions
from stylevar.utils.precision import cuda_like_autocast, cuda_like_casts as CudaLikeAutocast
from stylevar.utils.precision import full_precision
from tests.conftest import micro_configs
from tests.serve.test_cache import _image
from training.sft.objective import SFTObjective


@pytest.fixture
def bf16_pipe() -> StylePipeline:
    """The micro pipeline with what "auto" gives on CUDA: the model's autocast (made CUDA's by CudaLikeAutocast)."""
    pipe = StylePipeline.random(micro_configs(), seed=3)
    pipe.model.autocast_dtype = torch.bfloat16
    return pipe


@pytest.fixture
def dtypes(monkeypatch) -> dict[str, set[torch.dtype]]:
    """The dtypes every attention call saw: its queries, keys, values, the KV caches and `Block.queries`' output."""
    seen: dict[str, set[torch.dtype]] = {"q": set(), "k": set(), "v": set(), "cache": set(), "guide queries": set()}
    forward, keys_values, queries, cache_init = (BlendedAttention.forward, BlendedAttention.keys_values,
                                                 Block.queries, KVCache.__init__)

    def recording_forward(self, h, q, *args, **kwargs):
        seen["q"].add(q.dtype)
        return forward(self, h, q, *args, **kwargs)

    def recording_keys_values(self, h):
        k, v = keys_values(self, h)
        seen["k"].add(k.dtype)
        seen["v"].add(v.dtype)
        return k, v

    def recording_queries(self, *args):
        q = queries(self, *args)
        seen["guide queries"].add(q.dtype)
        return q

    def recording_cache(self, *args):
        cache_init(self, *args)
        seen["cache"].add(self.k_BHLc.dtype)

    monkeypatch.setattr(BlendedAttention, "forward", recording_forward)
    monkeypatch.setattr(BlendedAttention, "keys_values", recording_keys_values)
    monkeypatch.setattr(Block, "queries", recording_queries)
    monkeypatch.setattr(KVCache, "__init__", recording_cache)
    return seen


def test_it_casts_as_cuda_autocast_does_where_cpu_autocast_does_not():
    x, lin = torch.randn(2, 8), torch.nn.Linear(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the CPU's own lists: the norms stay in bf16
        assert F.layer_norm(lin(x), (8,)).dtype == F.normalize(lin(x), dim=-1).dtype == torch.bfloat16
    with cuda_like_autocast(torch.bfloat16):
        h = lin(x)
        assert h.dtype == (h @ h.T).dtype == torch.bfloat16
        assert {t.dtype for t in (F.layer_norm(h, (8,)), F.normalize(h, dim=-1), h.sum(), h.exp(), h.softmax(-1),
                                  F.mse_loss(h, h))} == {torch.float32}
        assert torch.addcmul(h, h, x).dtype == torch.float32  # the widest input
        assert (h * 2).dtype == torch.bfloat16  # not on CUDA's lists: its input's dtype
        with torch.autocast("cpu", enabled=False):
            assert lin(x).dtype == torch.float32
        assert full_precision(lin)(h).dtype == torch.float32  # the tokenizer's float32 region
    assert lin(x).dtype == torch.float32


def test_the_pipeline_keeps_queries_keys_values_and_cache_in_bf16(dtypes, bf16_pipe):
    with CudaLikeAutocast():
        out = bf16_pipe(_image(1), StyleMix.of(_image(2)), seed=0, guidance=0.5)
    assert out.size == (40, 28)
    assert dtypes == {name: {torch.bfloat16} for name in dtypes}


def test_the_batcher_keeps_queries_keys_values_and_cache_in_bf16(dtypes, bf16_pipe):
    runner = ModelRunner(bf16_pipe, 1024, ConditionCache(64 * 2**20))

    def run(jobs):  # the worker thread's autocast regions made CUDA's
        with CudaLikeAutocast():
            return runner.run(jobs)

    batcher = Batcher([run], BatchConfig(max_batch_size=8, max_wait_s=0.05, queue_size=8), on_oom=lambda: None)
    items = [Stylization(StylizeRequest(), _image(c), StyleMix.of(_image(9)), DEFAULT_GENERATION, seeds,
                         OutputOptions(max_side=1024)) for c, seeds in ((3, (0, 1)), (4, (2,)))]
    jobs = [batcher.submit(item.key, StylizeTask(item), rows=len(item.seeds), timeout_s=60.0) for item in items]
    batcher.start()
    try:
        images = [job.future.result(60.0) for job in jobs]
    finally:
        batcher.stop()
    assert [len(i) for i in images] == [2, 1]
    assert dtypes == {name: {torch.bfloat16} for name in dtypes}


def test_an_sft_step_keeps_queries_keys_and_values_in_bf16(dtypes):
    model = StylePipeline.random(micro_configs(), seed=3).model.train()
    objective = SFTObjective(model, label_smoothing=0.1, alpha_jitter=0.1, seed=0)
    size = model.tokenizer.cfg.image_size
    g = torch.Generator().manual_seed(0)
    batch = {k: torch.rand(2, 3, size, size, generator=g) * 2 - 1 for k in ("content", "style", "target")}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with cuda_like_autocast(torch.bfloat16):
        loss, _ = objective(batch)
    loss.backward()
    opt.step()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    trained = [p for p in model.parameters() if p.requires_grad]
    assert all(p.dtype == torch.float32 for p in trained) and any(p.grad.abs().sum() > 0 for p in trained)
    assert dtypes == {"q": {torch.bfloat16}, "k": {torch.bfloat16}, "v": {torch.bfloat16}, "cache": set(),
                      "guide queries": {torch.bfloat16}}
