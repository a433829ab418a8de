"""The compile policy (stylevar.runtime.compile) on the eager backend: the graphs a d20-shaped model compiles (its
20 per-block drop-path rates, 10 scales) stay within K + 1 for generation at batch 1, 2 and 8 and one for a
training step, shared by all blocks, and dynamo never reaches its recompile limit (it would then run eagerly)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from stylevar.config import OFFICIAL_PATCH_NUMS, VQVAEConfig, presets
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.runtime.compile import _configured, compile_blocks, recompile_limit_hits

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # tens of seconds of tracing


def d20_shaped() -> tuple[VQVAEConfig, object]:
    """d20's depth, drop-path rates and 10 scales at a small width (32 px images through a 2x tokenizer)."""
    d20 = presets("d20")[1]
    vq = VQVAEConfig(vocab_size=64, z_channels=8, ch=16, ch_mult=(1, 2), num_res_blocks=1,
                     patch_nums=OFFICIAL_PATCH_NUMS, norm_groups=8)
    tr = dataclasses.replace(d20, embed_dim=32, num_heads=2, vocab_size=64, z_channels=8, image_encoder="cnn",
                             encoder_dim=32)
    assert len(set(tr.drop_path_rates)) == 20  # a different rate per block
    return vq, tr


def _images(batch: int) -> torch.Tensor:
    return torch.rand(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch)) * 2 - 1


def test_generation_and_training_compile_one_set_of_graphs_for_all_blocks():
    model = StylePipeline.random(d20_shaped(), seed=0).model.eval()
    K = len(model.cfg.patch_nums)
    hits = recompile_limit_hits()
    count = compile_blocks(model, "eager")
    for batch in (1, 2, 8):
        model.generate(_images(batch), _images(batch), seed=0)
    assert 0 < count.graphs <= K + 1, count.graphs
    generation = count.graphs
    model.generate(_images(3), _images(3), seed=1)  # another batch size: nothing new
    assert count.graphs == generation

    model.train()
    c = _images(4)
    idx = model.tokenizer.encode_indices(c)
    for _ in range(2):
        model.teacher_forcing_logits(c, c, idx).logsumexp(-1).mean().backward()
    assert count.graphs == generation + 1  # one training graph, every block (every rate) through it
    assert recompile_limit_hits() == hits


def test_compiled_steps_compute_the_eager_ones_with_drop_path():
    vq, tr = d20_shaped()
    config = (vq, dataclasses.replace(tr, depth=4, drop_path_rate=0.5))
    eager = StylePipeline.random(config, seed=0).model
    compiled = StylePipeline.random(config, seed=0).model
    compile_blocks(compiled, "eager")
    c = _images(4)
    idx = eager.tokenizer.encode_indices(c)
    for model in (eager, compiled):
        model.train()
    torch.manual_seed(5)
    a = eager.teacher_forcing_logits(c, c, idx)
    torch.manual_seed(5)
    b = compiled.teacher_forcing_logits(c, c, idx)
    torch.testing.assert_close(a, b)  # the same rows dropped: the draws are eager in both
    with torch.no_grad():
        assert torch.equal(eager.eval().generate(c, c, seed=2), compiled.eval().generate(c, c, seed=2))


def test_compile_twice_or_an_unknown_backend_is_refused():
    model = StylePipeline.random(d20_shaped(), seed=0).model
    with pytest.raises(ValueError, match="compile backend must be one of inductor, eager"):
        compile_blocks(model, "tvm")
    with pytest.raises(ValueError, match="compile options are Inductor's"):
        compile_blocks(model, "eager", options={"max_autotune": True})
    compile_blocks(model, "eager")
    with pytest.raises(ValueError, match="compiled already"):
        compile_blocks(model, "eager")


def test_options_hold_while_a_step_runs_and_only_then():
    import torch._inductor.config as inductor_config

    before = inductor_config.freezing
    step = _configured(lambda: inductor_config.freezing, {"freezing": not before})
    assert step() is (not before)  # what dynamo reads while it traces the step
    assert inductor_config.freezing is before
