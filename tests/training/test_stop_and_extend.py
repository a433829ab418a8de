"""Stopping and extending a run: SIGINT / SIGTERM during training.sft and training.vqvae write a checkpoint at the
current step, say in one line how to resume and exit non-zero, and the re-run resumes there; a larger --max-steps
trains a finished run on, step for step as the longer run would have trained (an SFT run past its learning-rate drop
keeps the drop where it was), and a change of the rate of steps already trained is refused with the option that keeps
it (training.parts.extension)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import single_thread_env
from tests.training.test_sft import write_run_inputs
from training.parts.extension import RunExtension
from training.parts.log import read_log
from training.parts.optim import ScheduleConfig
from training.sft.run import schedule as sft_schedule

pytestmark = pytest.mark.slow  # training runs (the fast lane leaves them out)

REPO = Path(__file__).resolve().parents[2]
TOK_PRESET = {"tokenizer": {"vocab_size": 64, "z_channels": 8, "ch": 8, "ch_mult": [1, 1, 2], "num_res_blocks": 1,
                            "patch_nums": [1, 2, 4], "using_sa": False, "using_mid_sa": False}}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return write_run_inputs(tmp_path_factory.mktemp("stop"), count=24)


def sft_command(s, out: Path, steps: int, *extra) -> list[str]:
    return [sys.executable, "-m", "training.sft", "--data", str(s["manifest"]), "--preset", str(s["preset"]),
            "--tokenizer", str(s["tok"]), "--out", str(out), "--max-steps", str(steps), "--no-progress",
            "--batch-size", "4", "--log-every", "1", "--no-token-cache", *map(str, extra)]


def vqvae_command(s, out: Path, steps: int, *extra) -> list[str]:
    preset = s["root"] / "tok_preset.json"
    preset.write_text(json.dumps(TOK_PRESET))
    return [sys.executable, "-m", "training.vqvae", "--data", str(s["manifest"]), "--preset", str(preset),
            "--out", str(out), "--max-steps", str(steps), "--no-progress", "--batch-size", "4", "--log-every", "1",
            *map(str, extra)]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, env=single_thread_env(), capture_output=True, text=True, timeout=600)


def logged_steps(out: Path) -> list[int]:
    """The training steps in RUN/log.jsonl so far (a torn last line of a running process ignored)."""
    path = out / "log.jsonl"
    steps = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "loss" in rec:
            steps.append(rec["step"])
    return steps


def interrupt(cmd: list[str], out: Path, at_step: int, sig: int) -> tuple[int, str]:
    """Start ``cmd``, send ``sig`` once its log holds step ``at_step``; its exit status and stderr."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=single_thread_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 600
    while proc.poll() is None and at_step not in logged_steps(out) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, f"the run ended before step {at_step}: {proc.stderr.read()[-3000:]}"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=600)
    return proc.returncode, err


@pytest.mark.parametrize("recipe, sig", [("sft", signal.SIGINT), ("vqvae", signal.SIGTERM), ("vqvae", signal.SIGINT)])
def test_a_signal_checkpoints_the_current_step_and_the_rerun_resumes_there(inputs, tmp_path, recipe, sig):
    command = sft_command if recipe == "sft" else vqvae_command
    pinned = ("--lr-drop-step", 10_000) if recipe == "sft" else ()  # the drop past both lengths (see below)
    out = tmp_path / "run"
    status, err = interrupt(command(inputs, out, 10_000, *pinned), out, 3, sig)
    assert status == 128 + sig, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    name = signal.Signals(sig).name
    stops = [line for line in err.splitlines() if "stopped by" in line]
    assert len(stops) == 1, err[-3000:]
    stopped_at = max(logged_steps(out))  # the step the signal found running, ended and checkpointed
    assert stopped_at >= 3
    ckpt = out / "checkpoints" / f"step-{stopped_at:08d}.pt"
    assert stops[0] == (f"[run] stopped by {name} after step {stopped_at} of 10000: wrote {ckpt}; run the same "
                        f"command again to resume from step {stopped_at} (with a larger --max-steps to train longer)")
    assert ckpt.is_file() and not (out / "final").exists()

    # the re-run resumes at that step (here shortened: the same schedule for the steps taken)
    done = run(command(inputs, out, stopped_at + 2, *pinned))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed from step {stopped_at} " in done.stderr
    assert logged_steps(out) == list(range(1, stopped_at + 3))
    assert (out / "final" / "config.json").is_file()


@pytest.mark.parametrize("recipe", ["sft", "vqvae"])
def test_a_larger_max_steps_trains_a_finished_run_on_as_the_longer_run(inputs, tmp_path, recipe):
    command = sft_command if recipe == "sft" else vqvae_command
    pinned = ("--lr-drop-step", 4) if recipe == "sft" else ()  # the drop where both lengths have it
    first = run(command(inputs, tmp_path / "extended", 3, *pinned))
    assert first.returncode == 0, first.stderr[-3000:]
    again = run(command(inputs, tmp_path / "extended", 6, *pinned))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from step 3 " in again.stderr
    whole = run(command(inputs, tmp_path / "whole", 6, *pinned))
    assert whole.returncode == 0, whole.stderr[-3000:]
    curve = lambda out: [(r["step"], r["loss"], r["lr"]) for r in read_log(out) if "loss" in r]  # noqa: E731
    assert curve(tmp_path / "extended") == curve(tmp_path / "whole")
    assert json.loads((tmp_path / "extended" / "final" / "config.json").read_text())["extra"]["steps"] == 6


def test_a_finished_run_extends_with_its_drop_kept_and_a_moved_drop_is_refused(inputs, tmp_path):
    out = tmp_path / "run"
    assert run(sft_command(inputs, out, 5)).returncode == 0  # the drop at round(0.6 * 5) = step 3
    extended = run(sft_command(inputs, out, 7))  # a larger --max-steps alone: the drop stays at step 3
    assert extended.returncode == 0, extended.stderr[-3000:]
    assert extended.stderr.count("learning-rate drop kept at step 3, where this run had it: it has trained 5 steps, "
                                 "and --max-steps 7 alone would put the drop at step 4") == 1
    assert [r["lr"] < 5e-4 for r in read_log(out) if "loss" in r] == [False] * 3 + [True] * 4
    before = (out / "log.jsonl").read_text()
    refused = run(sft_command(inputs, out, 10, "--lr-drop-step", 6))
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert (f"error: {out} cannot be continued with these options: it has trained 7 steps with the learning-rate "
            "drop at step 3; the new options (--max-steps 10, --lr-drop-step 6) put the drop at step 6, which changes "
            "the rate of step 4, already trained. Leave out --lr-drop-step (or set it to 3) to keep the drop where it "
            "was, or choose a new --out.") in refused.stderr
    assert (out / "log.jsonl").read_text() == before
    other = run(sft_command(inputs, out, 9, "--lr", 1e-3))  # other changes: refused as before
    assert other.returncode == 1 and "different configuration (lr: 0.0005 -> 0.001)" in other.stderr


def test_the_extension_rule_compares_the_rate_of_the_trained_steps_only():
    sft = RunExtension(sft_schedule)
    opts = {"max_steps": 10, "warmup_steps": 2, "lr_drop_step": None, "lr_drop_fraction": 0.6, "lr_drop_factor": 0.2}
    assert sft.problem(opts, {**opts, "max_steps": 20}, steps_done=6) == ""  # drop 6 -> 12: step 7 not trained
    assert "changes the rate of step 7" in sft.problem(opts, {**opts, "max_steps": 20}, steps_done=7)
    assert sft.problem(opts, {**opts, "max_steps": 20, "lr_drop_step": 6}, steps_done=10) == ""
    flat = RunExtension(lambda o: ScheduleConfig(max_steps=o["max_steps"], drop_step=o["max_steps"]))
    assert flat.problem({"max_steps": 5}, {"max_steps": 50}, steps_done=5) == ""
