"""A recipe run, or the shard writer, where the train extra is missing (`pip install -e '.[app]'` installs the
service alone) is one line naming the missing modules and the install command, exit status 2, before anything is
read or written; so is a recipe asked for a GPU on a machine without one."""
from __future__ import annotations

import sys

import pytest

from data_tools import shards
from training.grpo import __main__ as grpo
from training.sft import __main__ as sft
from training.vqvae import __main__ as vqvae
from stylevar.utils import devices
from stylevar.utils.extras import install_line

RECIPES = {
    "training.sft": (sft, ["--tokenizer", "tok", "--max-steps", "1"]),
    "training.vqvae": (vqvae, ["--max-steps", "1"]),
    "training.grpo": (grpo, ["--init", "model", "--max-steps", "1"]),
}


@pytest.mark.parametrize("module", list(RECIPES))
def test_a_missing_train_extra_is_one_line_with_the_install_command(module, tmp_path, monkeypatch, capsys):
    recipe, args = RECIPES[module]
    monkeypatch.setitem(sys.modules, "webdataset", None)  # as if not installed (importlib finds no spec)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        recipe.main(["--data", str(tmp_path / "manifest.jsonl"), "--out", str(out), *args])
    assert info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"python -m {module}: error: this recipe needs the train extra (webdataset not "
                    f"installed): {install_line('train')}")
    assert not out.exists()


def test_the_shard_writer_says_the_same(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "webdataset", None)
    out = tmp_path / "shards"
    with pytest.raises(SystemExit) as info:
        shards.main(["--manifest", str(tmp_path / "manifest.jsonl"), "--out", str(out)])
    assert info.value.code == 2 and not out.exists()
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "python -m data_tools.shards: error: writing shards needs the train extra (webdataset not installed): "
        f"{install_line('train')}")


@pytest.mark.parametrize("module", list(RECIPES))
def test_a_gpu_this_machine_lacks_is_one_line(module, tmp_path, monkeypatch, capsys):
    recipe, args = RECIPES[module]
    monkeypatch.setattr(devices, "_no_gpu_driver", lambda: True)  # as on a machine without any GPU driver
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        recipe.main(["--data", str(tmp_path / "manifest.jsonl"), "--out", str(out), "--device", "cuda", *args])
    assert info.value.code == 2 and not out.exists()
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"python -m {module}: error: device 'cuda' is not available: this machine has no GPU driver (use --device cpu)")
