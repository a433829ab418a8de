"""A --model that is not a model directory (stylevar.loaders.model_dir, no torch): the Hub hint only for a name
written exactly OWNER/NAME that is no local path; the check itself imports no torch."""
from __future__ import annotations

import subprocess
import sys

import pytest

from stylevar.loaders.model_dir import ModelDirError, check_model_files, names_a_hub_repository

HUB_HINT = "A published model on the Hugging Face Hub is written hf:OWNER/NAME"


@pytest.mark.parametrize("given, hub", [
    ("Senfier-LiqiJing/StyleVAR", True), ("owner/name@v1:grpo", True),
    ("models/nope", False), ("runs/sft", False),  # where the project's commands write models
    ("./owner/name", False), ("owner/name/", False), ("owner/name/final", False), ("/owner/name", False),
    ("here/name", False),  # a folder here is named OWNER
])
def test_the_hub_hint_is_only_for_an_owner_name_that_is_no_local_path(tmp_path, monkeypatch, given, hub):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here").mkdir()
    assert names_a_hub_repository(given) is hub
    with pytest.raises(ModelDirError) as e:
        check_model_files(given)
    assert str(e.value).startswith("no usable model at ") and "no such folder" in str(e.value)
    assert (HUB_HINT in str(e.value)) is hub, str(e.value)


def test_the_check_imports_no_torch(tmp_path):
    code = ("import sys\nfrom stylevar.loaders.model_dir import check_model_files\n"
            "try:\n    check_model_files(sys.argv[1])\nexcept FileNotFoundError as e:\n    print(e)\n"
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == [f"no usable model at {tmp_path}: missing config.json, tokenizer.safetensors, "
                                        "transformer.safetensors. A model directory comes from a training run "
                                        "(RUN/final/), `stylevar convert`, `stylevar pull` or "
                                        "`StylePipeline.save_pretrained(DIR)`; pass it with --model DIR (the service "
                                        "also reads STYLEVAR_MODEL_DIR), or a published model as --model "
                                        "hf:OWNER/NAME.", "False"], done.stderr
