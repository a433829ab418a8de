"""training.device_tokenizer (issue 62), the command a lent GPU runs, as a CPU dry run: the environment printed, a
packed set trained to the end, a time budget that checkpoints and exits 0, the resume with RUN's batch, and the
refusals before any work (a missing package, no GPU); the batch that fills a GPU, from two measured peaks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from data_tools import pack
from data_tools.synth import SynthConfig, generate
from tests.conftest import single_thread_env
from tests.device_image import image_env
from training import device_tokenizer
from training.parts.log import read_log

REPO = Path(__file__).resolve().parents[2]
# a 32 px tokenizer (the style predictor's features need 32 px or more)
MICRO = {"tokenizer": {"vocab_size": 64, "z_channels": 8, "ch": 8, "ch_mult": [1, 1, 2, 2], "num_res_blocks": 1,
                       "patch_nums": [1, 2, 4], "using_sa": False, "using_mid_sa": False, "norm_groups": 4}}


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("device")
    manifest = generate(SynthConfig(out=str(root / "synth"), count=8, size=32, seed=4, val_fraction=0.25))
    assert pack.main(["--manifest", str(manifest), "--out", str(root / "pack"), "--roles", "style,target"]) == 0
    (root / "micro.json").write_text(json.dumps(MICRO))
    return root


def dry_run(root, out, *extra) -> list[str]:
    return ["--data", str(root / "pack"), "--out", str(out), "--device", "cpu", "--preset", str(root / "micro.json"),
            *map(str, extra)]


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_dry_run_trains_prints_the_environment_and_the_loss_curve(packed, tmp_path, capsys):
    out = tmp_path / "run"
    assert device_tokenizer.main(dry_run(packed, out, "--max-steps", 20, "--batch-size", 2)) == 0
    printed = capsys.readouterr().out
    env = json.loads(printed.splitlines()[0].removeprefix("[device] "))
    assert env["torch"] and env["missing"] == [] and "python" in env
    summary = json.loads((out / "device_summary.json").read_text())
    assert summary["finished"] and summary["last_step"] == 20 and summary["batch_size"] == 2
    assert [s for s, _ in summary["loss_curve"]] == [10, 20] and summary["steps_per_s"] > 0
    assert "step      20 loss" in printed
    config = json.loads((out / "config.json").read_text())
    assert config["channels_last"] and config["roles"] == "style,target" and config["style_feature_weight"] == 0.5
    assert (out / "final" / "tokenizer.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_the_budget_checkpoints_exits_0_and_the_next_call_resumes_with_the_runs_batch(packed, tmp_path, capsys):
    out = tmp_path / "run"
    # a budget of 60 microseconds: always spent after the first step, however fast or loaded the machine
    assert device_tokenizer.main(dry_run(packed, out, "--max-steps", 50, "--batch-size", 2, "--minutes", 1e-6)) == 0
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*.pt")) == ["step-00000001.pt"]
    assert "stopped at the time budget" in capsys.readouterr().err
    assert not (out / "final").exists()
    assert device_tokenizer.main(dry_run(packed, out, "--max-steps", 50, "--batch-size", 4, "--minutes", 1e-6)) == 0
    assert "resumed from step 1" in capsys.readouterr().err
    summary = json.loads((out / "device_summary.json").read_text())
    assert summary["batch_size"] == 2  # the run's, not --batch-size
    assert summary["last_step"] == 2 and not summary["finished"]  # the checkpoint's step: no log line yet
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*.pt"))[-1] == "step-00000002.pt"
    assert [r["step"] for r in read_log(out) if "loss" in r] == []  # log lines every 10 steps: none yet


def test_refusals_name_what_is_missing_before_any_work(packed, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(device_tokenizer, "NEEDED", (*device_tokenizer.NEEDED, "no_such_package_here"))
    assert device_tokenizer.main(dry_run(packed, tmp_path / "run")) == 2
    err = capsys.readouterr().err
    assert "['no_such_package_here']" in err and device_tokenizer.WHEELS in err
    monkeypatch.undo()
    # a package that the run's code imports (not named in NEEDED): found by importing that code first
    (tmp_path / "run_code_here.py").write_text("import numpy\nimport no_such_package_either\n")
    monkeypatch.syspath_prepend(tmp_path)
    monkeypatch.setattr(device_tokenizer, "RUN_MODULE", "run_code_here")
    assert device_tokenizer.main(dry_run(packed, tmp_path / "run")) == 2
    assert "['no_such_package_either']" in capsys.readouterr().err
    monkeypatch.undo()
    env = {"missing": [], "cuda_available": False, "torch": "x", "cuda": None}
    assert "no usable CUDA device" in device_tokenizer.check(env, "cuda")
    assert device_tokenizer.check(env, "cpu") is None
    assert not (tmp_path / "run").exists()


@pytest.mark.usefixtures("one_thread")
def test_the_step_that_measures_the_gpus_memory_trains_the_runs_objective_in_bf16(packed, tmp_path):
    """measured_batch's step (on CUDA it reads the peak memory after it), here on the CPU: the run's objective with
    its style-feature loss, bf16 autocast and channels_last, at two batch sizes."""
    import torch

    args = device_tokenizer.build_parser().parse_args(dry_run(packed, tmp_path / "run"))
    step = device_tokenizer.training_step(args, str(packed / "micro.json"), torch.device("cpu"))
    assert all(0 < step(b) < float("inf") for b in (1, 2))
    assert not (tmp_path / "run").exists()  # measuring writes nothing


def test_the_batch_that_fills_the_gpu_follows_the_measured_line():
    gib = 2**30
    # 2 GiB fixed + 0.25 GiB an image: 80 GiB at 85 % -> (68 - 2) / 0.25 = 264 images -> 256
    peaks = {8: 2 * gib + 8 * gib // 4, 16: 2 * gib + 16 * gib // 4}
    assert device_tokenizer.batch_to_fill(peaks, 80 * gib) == 256
    assert device_tokenizer.batch_to_fill(peaks, 4 * gib) == 8  # never below the measured batch
    assert device_tokenizer.batch_to_fill({8: gib, 16: gib}, 80 * gib, largest=512) == 512  # flat: the cap


@pytest.mark.slow
def test_the_device_script_brings_back_what_a_lent_machine_returns(packed, tmp_path):
    """scripts/device_tokenizer.sh as the device runs it (its `python3` is the one with torch, its packages the
    image's and the carried wheels'), on the CPU."""
    venv_bin = Path(sys.executable).parent
    env = image_env("tokenizer", {**single_thread_env(), "PATH": f"{venv_bin}:{os.environ['PATH']}",
                                  "DEVICE_PACK": str(packed / "pack")})
    run, back = tmp_path / "run", tmp_path / "back"
    done = subprocess.run([str(REPO / "scripts" / "device_tokenizer.sh"), str(run), str(back), "--device", "cpu",
                           "--preset", str(packed / "micro.json"), "--max-steps", "50", "--batch-size", "2",
                           "--minutes", "1e-6"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    names = sorted(p.name for p in back.iterdir())
    assert names == ["config.json", "device_summary.json", "log.jsonl", "tokenizer.safetensors.part-00",
                     "tokenizer_config.json"]
    assert (back / "tokenizer.safetensors.part-00").read_bytes() == (run / "latest" / "tokenizer.safetensors").read_bytes()
    assert json.loads((back / "tokenizer_config.json").read_text())["extra"]["steps"] == 1
    assert len(names) <= 8 and all(p.stat().st_size <= 16 << 20 for p in back.iterdir())
