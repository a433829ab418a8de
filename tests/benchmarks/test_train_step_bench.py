"""benchmarks/train_step.py at a micro size, without the reference: every variant steps, the levers leave what
is learned unchanged (float rounding), the report and the JSON have their fields."""
from __future__ import annotations

import json

import pytest
import torch

from benchmarks import train_step
from benchmarks.train_step import EAGER as EAGER_STEP, StepBenchConfig
from stylevar.runtime.bench import flops_of
from tests.conftest import micro_configs

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def _micro():
    from stylevar.pipelines.pipeline import StylePipeline

    return StylePipeline.random(micro_configs(), seed=0).model


EAGER = ("fused encodes", "token cache", "fused AdamW", "foreach clip", "channels-last encoders", "eager", "cached")


def _check(agreement: dict) -> None:
    for name, a in agreement.items():
        assert a["first_loss_difference"] < 1e-5, name
        assert a["third_loss_difference"] < 1e-4, name
        assert a["max_weight_difference"] < 1e-4, name


def test_each_lever_learns_what_todays_step_learns():
    cfg = StepBenchConfig(reference=False)
    agreement = train_step.lever_agreement(_micro(), 2, cfg, EAGER)
    assert set(agreement) == set(EAGER)
    _check(agreement)


@pytest.mark.slow
def test_compiled_blocks_learn_what_eager_ones_learn():
    """Compiled, the drop-path draws stay eager's (fallback_random): the same rows dropped, the same steps."""
    import dataclasses

    from stylevar.pipelines.pipeline import StylePipeline
    from stylevar.models.transformer import StyleVAR

    vq, tr = micro_configs()
    plain = StylePipeline.random((vq, tr), seed=0).model
    model = StyleVAR(dataclasses.replace(tr, drop_path_rate=0.5), plain.tokenizer)
    model.load_state_dict(plain.state_dict())
    with torch.no_grad():  # open the blocks' gates, so that a drop shows in the loss
        for blk in model.blocks:
            blk.ada_lin[1].bias[: 2 * tr.embed_dim].fill_(1.0)
    agreement = train_step.lever_agreement(model, 4, StepBenchConfig(reference=False),
                                           ("compiled blocks", "default", "cached+compiled"))
    _check(agreement)


def test_the_step_trains_and_flops_are_counted():
    model = _micro()
    batch = train_step.triplets(2, model.tokenizer.cfg.image_size, 0)
    step = train_step.our_step(model, batch, EAGER_STEP, "fp32")  # the default compiles: slow
    losses = [step() for _ in range(4)]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    assert flops_of(step) > 0


def test_the_command_reports_samples_per_second_and_mfu(capsys):
    argv = ["--no-reference", "--preset", "tiny", "--batch-sizes", "1", "--precisions", "fp32", "--repeats", "1",
            "--warmup", "0", "--variants", "today,eager", "--peak-tflops", "1"]
    assert train_step.main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["steps"]["fp32 batch 1"]
    assert set(rows) == {"today", "eager"}
    for r in rows.values():
        assert r["ms_per_step"] > 0 and r["samples_per_s"] == pytest.approx(1000 / r["ms_per_step"])
        assert 0 < r["mfu"] < 1 and r["tflop_per_step"] > 0
    assert train_step.main(argv) == 0
    text = capsys.readouterr().out
    assert "fp32 batch 1" in text and "samples/s" in text and "MFU" in text
    with pytest.raises(SystemExit):
        train_step.main(["--preset", "tiny"])  # the reference runs at its own shape only
