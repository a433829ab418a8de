"""Training a finished SFT run longer (training.parts.extension through RunDir.prepare), without training: a
larger --max-steps keeps a learning-rate drop the run has passed (said once, written to config.json), a drop
not yet reached moves with the new length, and only a change of a trained step's rate is refused."""
from __future__ import annotations

import json

import pytest

from tests.training.test_loop import CPU1
from training.parts.extension import RunExtension
from training.parts.rundir import RunConfigMismatchError, RunDir
from training.sft.run import schedule as sft_schedule

SFT = RunExtension(sft_schedule)
OPTIONS = {"lr": 5e-4, "max_steps": 300, "warmup_steps": 20, "lr_drop_step": None, "lr_drop_fraction": 0.6,
           "lr_drop_factor": 0.2}


def trained(root, config, steps: int) -> RunDir:
    """RUN/ of a run of ``config`` that has checkpointed ``steps`` steps (the checkpoint's name is what counts)."""
    run = RunDir.prepare(root, config, CPU1, extension=SFT)
    (run.checkpoints / f"step-{steps:08d}.pt").write_bytes(b"")
    return run


def test_a_larger_max_steps_keeps_the_drop_a_finished_run_has_passed(tmp_path):
    trained(tmp_path, OPTIONS, 300)  # the README's SFT_STEPS=300: the drop at step 180
    run = RunDir.prepare(tmp_path, {**OPTIONS, "max_steps": 400}, CPU1, extension=SFT)  # then SFT_STEPS=400
    assert run.config["lr_drop_step"] == 180 and run.config["max_steps"] == 400
    assert json.loads(run.config_path.read_text())["lr_drop_step"] == 180  # later resumes keep it too
    assert run.notes == ("learning-rate drop kept at step 180, where this run had it: it has trained 300 steps, and "
                         "--max-steps 400 alone would put the drop at step 240 (--lr-drop-step places it, at a step "
                         "not yet trained)",)
    kept = sft_schedule(run.config)
    assert [kept.factor(s) for s in (179, 180, 399)] == [1.0, 0.2, 0.2]
    again = RunDir.prepare(tmp_path, {**OPTIONS, "max_steps": 400}, CPU1, extension=SFT)  # the same command
    assert again.config == run.config and again.notes == ()  # said once


def test_a_drop_not_yet_reached_moves_with_the_new_length(tmp_path):
    trained(tmp_path, OPTIONS, 100)  # stopped before its drop at 180
    run = RunDir.prepare(tmp_path, {**OPTIONS, "max_steps": 400}, CPU1, extension=SFT)
    assert run.config["lr_drop_step"] is None and sft_schedule(run.config).resolved_drop_step == 240
    assert run.notes == ()


def test_only_a_drop_placed_under_trained_steps_is_refused(tmp_path):
    trained(tmp_path, OPTIONS, 300)
    with pytest.raises(RunConfigMismatchError) as refused:
        RunDir.prepare(tmp_path, {**OPTIONS, "max_steps": 400, "lr_drop_step": 250}, CPU1, extension=SFT)
    assert str(refused.value) == (
        f"{tmp_path} cannot be continued with these options: it has trained 300 steps with the learning-rate drop "
        "at step 180; the new options (--max-steps 400, --lr-drop-step 250) put the drop at step 250, which changes "
        "the rate of step 181, already trained. Leave out --lr-drop-step (or set it to 180) to keep the drop where "
        "it was, or choose a new --out.")
    placed = RunDir.prepare(tmp_path, {**OPTIONS, "max_steps": 400, "lr_drop_step": 180}, CPU1, extension=SFT)
    assert placed.notes == () and placed.config["lr_drop_step"] == 180
    with pytest.raises(RunConfigMismatchError, match=r"different configuration \(lr: 0.0005 -> 0.001\)"):
        RunDir.prepare(tmp_path, {**OPTIONS, "max_steps": 400, "lr": 1e-3}, CPU1, extension=SFT)


def test_settle_leaves_options_alone_when_no_trained_step_changes():
    assert SFT.settle(OPTIONS, {**OPTIONS, "max_steps": 400}, steps_done=180) == ({**OPTIONS, "max_steps": 400}, "")
    settled, note = SFT.settle(OPTIONS, {**OPTIONS, "max_steps": 400}, steps_done=181)
    assert settled["lr_drop_step"] == 180 and "kept at step 180" in note
    flat = RunExtension(lambda o: sft_schedule({**OPTIONS, **o, "lr_drop_step": o["max_steps"]}))
    assert flat.settle({"max_steps": 5}, {"max_steps": 50}, steps_done=5) == ({"max_steps": 50}, "")
