"""``python -m training.vqvae --batch-size auto``: the batch that fills a GPU, from the line through two measured
peaks; the measured step (the run's own objective) on the CPU; the option's spelling; a resumed run keeps its batch."""
from __future__ import annotations

import argparse
import json

import pytest

from stylevar.config import VQVAEConfig
from tests.training.test_loop import CPU1
from training.sft import __main__ as sft
from training.vqvae import __main__ as vqvae
from training.vqvae.batch import batch_to_fill, resolve_batch, training_step

TOK = dict(vocab_size=64, z_channels=8, ch=8, ch_mult=[1, 1, 2], num_res_blocks=1, patch_nums=[1, 2, 4],
           using_sa=False, using_mid_sa=False)  # 16 px
GIB = 2**30


def _args(tmp_path, *extra) -> argparse.Namespace:
    return vqvae.build_parser().parse_args(["--data", str(tmp_path / "m.jsonl"), "--out", str(tmp_path / "run"),
                                            "--max-steps", "4", "--lpips-weight", "0", *map(str, extra)])


def test_the_batch_follows_the_measured_line_in_powers_of_two():
    # 2 GiB fixed + 0.25 GiB an image; 68 GiB to fill -> (68 - 2) / 0.25 = 264 images -> 256
    peaks = {8: 2 * GIB + 8 * GIB // 4, 16: 2 * GIB + 16 * GIB // 4}
    assert batch_to_fill(peaks, 68 * GIB) == 256
    assert batch_to_fill(peaks, 3 * GIB) == 8  # never below the smaller measured batch
    assert batch_to_fill({8: GIB, 16: GIB}, 68 * GIB, largest=512) == 512  # flat: the cap


def test_batch_size_takes_auto_or_a_positive_number(tmp_path):
    assert _args(tmp_path, "--batch-size", "auto").batch_size == "auto"
    assert _args(tmp_path, "--batch-size", "12").batch_size == 12
    for bad in ("0", "-4", "many"):
        with pytest.raises(SystemExit):
            _args(tmp_path, "--batch-size", bad)
    with pytest.raises(SystemExit):  # the recipes without the measured step take numbers only
        sft.build_parser().parse_args(["--data", "m", "--tokenizer", "t", "--out", "o", "--max-steps", "1",
                                       "--batch-size", "auto"])


@pytest.mark.usefixtures("one_thread")
def test_the_measured_step_trains_the_runs_objective_on_the_cpu(tmp_path):
    """What measured_batch runs before reading the GPU's peak memory: the run's objective, its layout and
    precision, at two batch sizes; nothing written."""
    args = _args(tmp_path, "--batch-size", "auto", "--channels-last", "--gradient-weight", "1")
    step = training_step(args, VQVAEConfig.from_dict(TOK), CPU1)
    assert all(0 < step(b) < float("inf") for b in (1, 2))
    assert not (tmp_path / "run").exists()


def test_auto_keeps_a_resumed_runs_batch_and_needs_cuda_otherwise(tmp_path):
    args = _args(tmp_path, "--batch-size", "auto")
    with pytest.raises(SystemExit, match="CUDA"):
        resolve_batch(args, VQVAEConfig.from_dict(TOK), CPU1)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps({"batch_size": 48}))
    assert resolve_batch(args, VQVAEConfig.from_dict(TOK), CPU1)[0] == 48
