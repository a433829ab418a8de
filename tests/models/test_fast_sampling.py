"""Fast sampling: off is the full sampler bit for bit; on, only the pruned scales are computed
differently (the coarser scales' tokens are the full sampler's), the blocks see fewer tokens, and the option
reaches the model from the pipeline, the service's form and the command line."""
from __future__ import annotations

import copy
import dataclasses
import io
import json

import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image

from serve.http.app import create_app
from serve.settings import ServeSettings
from stylevar import cli
from stylevar.cli import stylize as stylize_cli
from stylevar.config import DEFAULT_GENERATION, GenerationConfig
from stylevar.pipelines.request import StylizeRequest
from stylevar.models.transformer import StyleBlend, StyleVAR
from stylevar.models.transformer import pruning
from stylevar.models.transformer.pruning import FastSampling

PLAN = FastSampling(keep=0.25, min_tokens=16)  # the micro model's scales 1, 2, 4, 8: groups 1 of 4, 4 of 16 kept


def inputs(batch: int = 2, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(batch, 3, 32, 32, generator=g) * 2 - 1, torch.rand(batch, 3, 32, 32, generator=g) * 2 - 1


def tokens_through_the_blocks(model: StyleVAR, **settings) -> tuple[int, list[torch.Tensor]]:
    """How many token rows the first block computed over one generation, and the sampled tokens."""
    seen: list[int] = []
    hook = model.blocks[0].register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[1]))
    try:
        out = model.generate_with_indices(*inputs(), **settings)
    finally:
        hook.remove()
    return sum(seen), out.indices


def lively(model: StyleVAR) -> StyleVAR:
    """A copy of a freshly initialised model whose blocks change their tokens (gates 1 instead of ~0)."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for blk in model.blocks:
            blk.ada_lin[1].bias[: 2 * model.cfg.embed_dim].fill_(1.0)
    return model


def test_the_plan_merges_the_last_scales_only():
    assert PLAN.detail_groups((1, 2, 4, 8)) == [None, None, 1, 4]
    assert PLAN.tokens((1, 2, 4, 8)) == [1, 4, 16 - 3 * 3, 64 - 3 * 12]
    assert FastSampling().detail_groups((1, 2, 4, 8)) == [None, None, None, 4]  # the default: scales from 5 x 5
    assert FastSampling().detail_groups((1, 2, 3, 4, 5, 6, 8, 10)) == [None] * 4 + [1, 2, 4, 6]
    assert FastSampling(keep=1.0).detail_groups((1, 2, 4, 8)) == [None] * 4
    assert FastSampling(keep=0.0, min_tokens=16).tokens((1, 2, 4, 8)) == [1, 4, 4, 16]  # every group merged
    assert FastSampling(keep=0.5).tokens((3, 5)) == [9, 25 - 3 * 2]  # an odd side: 2 x 2 groups, the rest single
    with pytest.raises(ValueError, match="keep"):
        FastSampling(keep=1.5)


@pytest.mark.parametrize("pn, detail", [(4, 0), (4, 2), (5, 1), (5, 4), (6, 9)])
def test_a_group_split_merges_groups_and_puts_every_position_back(pn, detail):
    g = torch.Generator().manual_seed(pn + detail)
    scores, x = torch.rand(2, pn * pn, generator=g), torch.randn(4, pn * pn, 3, generator=g)  # rows 2, 3: guidance's
    split = pruning.GroupSplit(scores, pn, detail, rows=4)
    tokens = split.tokens(x, 1)
    groups = (pn // 2) ** 2
    assert tokens.shape == (4, pn * pn - 3 * (groups - detail), 3)
    back = split.positions(tokens)
    assert back.shape == x.shape
    means = pruning.group_means(x, 1, pn)  # (4, groups, 3)
    for r in range(4):  # rows 2 and 3 (guidance's unstyled rows) take rows 0 and 1's split
        single = set(split.single_Bn[r % 2].tolist())
        assert len(single) == 4 * detail + pn * pn - 4 * groups
        for p in range(pn * pn):
            i, j = divmod(p, pn)
            expected = x[r, p] if p in single else means[r, (i // 2) * (pn // 2) + j // 2]
            torch.testing.assert_close(back[r, p], expected)
    top = scores.view(2, pn, pn)[:, : 2 * (pn // 2), : 2 * (pn // 2)]
    if detail:  # the group of the largest summed score is computed position by position
        sums = torch.nn.functional.avg_pool2d(top.unsqueeze(1), 2).flatten(1)
        best = int(sums[0].argmax())
        assert (best // (pn // 2)) * 2 * pn + (best % (pn // 2)) * 2 in set(split.single_Bn[0].tolist())


@pytest.mark.slow
def test_merging_nothing_computes_what_the_full_sampler_computes(micro_pipeline, monkeypatch):
    """Every group of the last scale kept, through the merging path: the full sampler's tokens (greedy)."""
    model = lively(micro_pipeline.model)
    monkeypatch.setattr(FastSampling, "detail_groups", lambda self, patch_nums: [None, None, None, 16])
    content, style = inputs()
    full = model.generate_with_indices(content, style, seed=0, top_k=1)
    rows, fast = tokens_through_the_blocks(model, seed=0, top_k=1, fast=True)
    assert rows == model.cfg.num_tokens
    assert all(torch.equal(a, b) for a, b in zip(fast, full.indices))


@pytest.mark.slow
@pytest.mark.parametrize("guidance", [0.0, 1.5])
def test_off_is_the_full_sampler_bit_for_bit(micro_pipeline, monkeypatch, guidance):
    model = micro_pipeline.model
    content, style = inputs()
    default = model.generate_with_indices(content, style, seed=[3, 4], top_k=8, guidance=guidance)
    monkeypatch.setattr(pruning.ScalePruner, "__init__", lambda *a, **k: pytest.fail("pruning ran with fast off"))
    off = model.generate_with_indices(content, style, seed=[3, 4], top_k=8, guidance=guidance, fast=False)
    assert torch.equal(off.images, default.images)
    assert all(torch.equal(a, b) for a, b in zip(off.indices, default.indices))
    assert GenerationConfig().fast is False and DEFAULT_GENERATION.fast is False


@pytest.mark.slow
def test_off_greedy_tokens_are_teacher_forcings(micro_pipeline):
    model = micro_pipeline.model
    content, style = inputs()
    out = model.generate_with_indices(content, style, top_k=1, seed=0, fast=False)
    with torch.no_grad():
        logits = model.teacher_forcing_logits(content, style, out.indices)
    assert torch.equal(logits.argmax(-1), torch.cat(out.indices, dim=1))


@pytest.mark.slow
def test_on_differs_only_at_the_pruned_scales(micro_pipeline, monkeypatch):
    model = lively(micro_pipeline.model)
    monkeypatch.setattr(model, "fast_sampling", PLAN)
    full_rows, full = tokens_through_the_blocks(model, seed=[3, 4], top_k=1)
    fast_rows, fast = tokens_through_the_blocks(model, seed=[3, 4], top_k=1, fast=True)
    assert full_rows == model.cfg.num_tokens and fast_rows == sum(PLAN.tokens(model.cfg.patch_nums)) == 40
    assert [t.shape for t in fast] == [t.shape for t in full]
    assert all(torch.equal(a, b) for a, b in zip(fast[:2], full[:2]))  # the coarse scales: the same tokens
    assert not all(torch.equal(a, b) for a, b in zip(fast[2:], full[2:]))
    assert all(int(t.min()) >= 0 and int(t.max()) < model.cfg.vocab_size for t in fast)


@pytest.mark.slow
def test_on_runs_with_guidance_and_masked_blends(micro_pipeline, monkeypatch):
    model = micro_pipeline.model
    monkeypatch.setattr(model, "fast_sampling", PLAN)
    content, style = inputs()
    masks = torch.zeros(2, 2, 32, 32)
    masks[:, 0, :, :16] = 1
    blend = StyleBlend([style, style.flip(0)], torch.tensor([0.7, 0.3]), masks)
    for style_input, guidance in ((style, 2.0), (blend, 0.0), (blend, 1.0)):
        full = model.generate_with_indices(content, style_input, seed=[1, 2], top_k=8, guidance=guidance)
        fast = model.generate_with_indices(content, style_input, seed=[1, 2], top_k=8, guidance=guidance, fast=True)
        assert fast.images.shape == full.images.shape and torch.isfinite(fast.images).all()
        assert all(torch.equal(a, b) for a, b in zip(fast.indices[:2], full.indices[:2]))


@pytest.mark.slow
def test_prepared_model_runs_fast(micro_pipeline):
    from stylevar.runtime.inference import InferenceConfig, prepare

    model = prepare(copy.deepcopy(micro_pipeline.model), InferenceConfig())
    content, style = inputs()
    full = model.generate_with_indices(content, style, seed=0, top_k=8)
    fast = model.generate_with_indices(content, style, seed=0, top_k=8, fast=True)
    assert all(torch.equal(a, b) for a, b in zip(fast.indices[:2], full.indices[:2]))


def test_the_batching_key_separates_fast_and_full_requests(micro_pipeline):
    content = Image.new("RGB", (16, 16))
    full, fast = (micro_pipeline.prepare(StylizeRequest(fast=f), content, content).key for f in (False, True))
    assert full != fast and hash(full) != hash(fast)
    assert micro_pipeline.prepare(StylizeRequest(seed=3), content, content).key == full


@pytest.fixture
def fast_calls(monkeypatch) -> list[bool]:
    """The `fast` setting of every `StyleVAR` generation in this process."""
    calls: list[bool] = []
    generate = StyleVAR._generate

    def spy(self, content, style, settings, *args, **kwargs):
        calls.append(settings.fast)
        return generate(self, content, style, settings, *args, **kwargs)

    monkeypatch.setattr(StyleVAR, "_generate", spy)
    return calls


def png(colour: tuple[int, int, int], size: tuple[int, int] = (40, 32)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, "PNG")
    return buf.getvalue()


def test_the_service_form_reaches_the_pipeline(micro_model_dir, fast_calls):
    settings = ServeSettings(model_dir=micro_model_dir, device=["cpu"], ui=False, warmup=False, queue_size=4)
    files = [("content", ("c.png", png((200, 40, 40)), "image/png")),
             ("style", ("s.png", png((20, 40, 220)), "image/png"))]
    with TestClient(create_app(settings)) as http:
        for value, expected in (("true", True), ("false", False), (None, False)):
            data = {"seed": "1"} if value is None else {"seed": "1", "fast": value}
            r = http.post("/stylize", files=files, data=data)
            assert r.status_code == 200, r.text
            assert fast_calls[-1] is expected, value
        assert http.post("/stylize", files=files, data={"fast": "maybe"}).status_code == 422


@pytest.mark.slow
def test_the_cli_flag_reaches_the_pipeline(micro_model_dir, tmp_path, fast_calls):
    Image.new("RGB", (40, 30), (200, 30, 30)).save(tmp_path / "c.png")
    Image.new("RGB", (32, 32), (20, 30, 200)).save(tmp_path / "s.png")
    parser = cli.build_parser(["stylize"])
    assert stylize_cli.stylize_request(parser.parse_args(["stylize", "c", "s", "-o", "o.png", "--fast"])).fast
    assert not stylize_cli.stylize_request(parser.parse_args(["stylize", "c", "s", "-o", "o.png"])).fast
    for flags, expected in (([], False), (["--fast"], True)):
        assert cli.main(["stylize", str(tmp_path / "c.png"), str(tmp_path / "s.png"), "-o", str(tmp_path / "o.png"),
                         "--model", str(micro_model_dir), "--device", "cpu", *flags]) == 0
        assert fast_calls[-1] is expected


@pytest.mark.slow
def test_the_pipeline_takes_fast(micro_pipeline, fast_calls):
    content, style = Image.new("RGB", (24, 16), (200, 40, 40)), Image.new("RGB", (16, 16), (20, 40, 220))
    a = micro_pipeline(content, style, seed=2, fast=True)
    assert fast_calls == [True] and a.size == (24, 16)
    assert dataclasses.replace(micro_pipeline.generation_config(fast=True), fast=False) == \
        micro_pipeline.generation_config()


@pytest.mark.slow
def test_the_speed_benchmark_times_the_fast_row(capsys):
    from benchmarks import cpu_pipeline
    from benchmarks.cpu_pipeline import FAST

    assert cpu_pipeline.main(["--batch-sizes", "1", "--repeats", "1", "--warmup", "0", "--fast-keep", "0.5",
                              "--agreement-seeds", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    stages = out["stages_ms_per_image"]["1"]
    assert set(stages) == {"plain", "fp32", FAST} and out["fast_plan"] == {"keep": 0.5, "min_tokens": 25}
    assert all(v > 0 for v in stages[FAST].values())
    assert 0 < out["token_agreement_with_fp32"][FAST] <= 1
