"""Generation's memory on the meta device (stylevar.runtime.memory): the loop's terms are its tensors' shapes, the
pieces add up to what the whole loop holds, the batch that fits, the tables in the docs, the service's default."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks.memory_table import GiB, fitting_table, serving_table
from serve.engine.sizing import CPU_MAX_BATCH, MEMORY_FRACTION, device_max_batch, default_max_batch
from stylevar.config import DEFAULT_GENERATION, GenerationConfig, StyleVARConfig, presets
from stylevar.models.tokenizer import MultiScaleVQVAE
from stylevar.models.transformer import StyleVAR
from stylevar.runtime.memory import LiveBytes, generation_memory, max_batch
from tests.conftest import micro_configs

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_live_bytes_counts_each_storage_once_and_what_is_let_go():
    with torch.device("meta"), LiveBytes() as live:
        a = torch.empty(1000)  # 4000 bytes
        view = a[10:20].view(2, 5)  # the same storage
        b = a * 2
        assert live.held() == 8000
        del b
        assert live.held() == 4000 and live.peak == 8000
        live.reset_peak()
        assert live.peak == 4000 and view.shape == (2, 5)


@pytest.mark.parametrize("guidance", [False, True])
def test_the_cache_and_the_queries_are_their_shapes(guidance):
    cfg = micro_configs()[1]
    R, L, C = 3 * (2 if guidance else 1), cfg.num_tokens, cfg.embed_dim
    fp32 = generation_memory(cfg, 3, guidance=guidance)
    assert fp32.rows == R
    assert fp32.kv_cache == cfg.depth * 2 * R * L * C * 4  # keys and values of every token, every block
    assert fp32.queries == cfg.depth * R * 2 * L * C * 4  # the style's and the content's, every block
    bf16 = generation_memory(cfg, 3, torch.bfloat16, guidance=guidance)
    assert (bf16.kv_cache, bf16.queries) == (fp32.kv_cache // 2, fp32.queries // 2)
    assert fp32.step > 0
    with pytest.raises(ValueError, match="batch"):
        generation_memory(cfg, 0)


def whole_loop_peak(vq, tr, batch: int) -> int:
    """The peak of `sample_tokens` of the whole model on the meta device, its weights and condition not counted."""
    tokenizer = MultiScaleVQVAE(vq)  # built for real: its quantizer computes on construction
    with torch.device("meta"):
        model = StyleVAR(tr, tokenizer).to("meta").eval()
    with torch.no_grad():
        images = torch.empty(batch, 3, vq.image_size, vq.image_size, device="meta")
        cond = model.condition(images, images)
        known = [*model.parameters(), *model.buffers(), cond.cond_BD, cond.sos_B1C, cond.style_ln_BSLC,
                 cond.content_ln_BLC]
        with LiveBytes(known) as live:
            model.sample_tokens(cond, [torch.Generator()], model.alpha_K, DEFAULT_GENERATION)
    return live.peak


@pytest.mark.slow
def test_the_pieces_add_up_to_what_the_whole_d20_loop_holds():
    """The table's sum against the whole loop of d20 (every block, every scale, the sampling) on the meta device:
    within 3% (what the pieces leave out: the level and position embeddings, one scale's logits kept into the next)."""
    vq, tr = presets("d20")
    for batch in (1, 2):
        assert whole_loop_peak(vq, tr, batch) == pytest.approx(generation_memory(tr, batch).total, rel=0.03)


def test_max_batch_is_the_largest_that_fits():
    cfg = micro_configs()[1]
    one = generation_memory(cfg, 1).total
    for budget in (one, 10 * one + 1, 37 * one):
        b = max_batch(cfg, budget)
        assert generation_memory(cfg, b).total <= budget < generation_memory(cfg, b + 1).total
    assert max_batch(cfg, one - 1) == 0
    assert max_batch(cfg, 10**15, limit=256) == 256
    assert max_batch(cfg, 40 * one, guidance=True) == max_batch(cfg, 40 * one) // 2


def test_the_tables_in_the_docs_are_what_the_code_computes():
    serving, fitting = serving_table(), fitting_table()
    for doc in ("serving.md", "gpus.md"):
        assert serving in (DOCS / doc).read_text(), f"docs/{doc}: run python -m benchmarks.memory_table --serving"
    assert fitting in (DOCS / "gpus.md").read_text()


def runner(cfg: StyleVARConfig, device: str, *, autocast=None, guidance: float = 0.0):
    model = SimpleNamespace(cfg=cfg, loop_dtype=autocast or torch.float32)  # what StyleVAR.loop_dtype gives
    pipe = SimpleNamespace(model=model, generation_config=lambda: GenerationConfig(guidance=guidance))
    return SimpleNamespace(pipe=pipe, device=torch.device(device))


def test_the_service_default_batch_follows_from_the_table():
    """On a GPU: the table's batch for 80% of the free memory (the docs' 64 GiB row for 80 GiB free); on the CPU: 8."""
    d20 = StyleVARConfig.preset("d20")
    free = {torch.device("cuda", 0): 80 * GiB, torch.device("cuda", 1): 40 * GiB}
    fp32, bf16 = runner(d20, "cuda:0"), runner(d20, "cuda:0", autocast=torch.bfloat16)
    assert MEMORY_FRACTION * 80 == 64
    row = re.search(r"^\| 64 GiB \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|$", fitting_table(), re.M)
    assert device_max_batch(fp32, free.get) == max_batch(d20, 64 * GiB) == int(row[1])
    assert device_max_batch(bf16, free.get) == int(row[2])
    assert device_max_batch(runner(d20, "cuda:0", guidance=0.5), free.get) == int(row[3])
    assert default_max_batch([fp32, runner(d20, "cuda:1")], free.get) == max_batch(d20, 32 * GiB)
    assert default_max_batch([runner(d20, "cpu")], free.get) == CPU_MAX_BATCH == 8
    assert device_max_batch(fp32, lambda device: 0) == 1, "a batch of one is tried (and answered 503 if it fails)"
