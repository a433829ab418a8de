"""The shipped demo model: loads offline by default, is labelled, and moves colours toward the style."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stylevar.loaders.model_dir import DEMO_LABEL, DEMO_MODEL_DIR
from stylevar.pipelines.pipeline import StylePipeline

EXAMPLES = Path(__file__).resolve().parents[2] / "stylevar" / "assets" / "examples"


@pytest.mark.slow
def test_demo_model_is_shipped_small_and_labelled():
    files = {p.name for p in DEMO_MODEL_DIR.iterdir()}
    assert {"config.json", "tokenizer.safetensors", "transformer.safetensors", "README.md"} <= files
    assert sum(p.stat().st_size for p in DEMO_MODEL_DIR.iterdir()) < 30 * 2**20
    cfg = json.loads((DEMO_MODEL_DIR / "config.json").read_text())
    assert cfg["demo"] is True
    pipe = StylePipeline.from_pretrained(device="cpu")  # the default is the demo model
    assert pipe.config.demo and pipe.config.label == DEMO_LABEL
    card = (DEMO_MODEL_DIR / "README.md").read_text()
    assert "demo" in card and "copy-content" in card and "reinhard" in card
    ev, photos = cfg["extra"]["evaluation"], cfg["extra"]["evaluation_photos"]
    # The content's shapes are kept: edge correlation with the content >= 0.6 on the four photographs (the first
    # demo model had -0.01) and >= 0.5 on the procedural scenes, whose few flat colours the palette step maps
    # onto the style's (where two of them land on one colour, their edge goes; the step alone keeps 0.45 of
    # them). The content-guided refinement in config.json puts the content's edges back; the card reports the
    # unrefined row next to it. Real photographs at the returned size: test_demo_model_on_held_out_real_pairs.
    assert cfg["refine"]["radius"] > 0
    assert ev["model"]["edge_corr"] >= 0.5 and photos["model"]["edge_corr"] >= 0.6
    raw = ev["transformer alone"]
    assert raw["edge_corr"] < ev["model"]["edge_corr"]
    # SSIM to the target at least Reinhard's (and copy-content's), and seeds that change the result
    assert ev["model"]["ssim"] >= max(ev["reinhard"]["ssim"], ev["copy-content"]["ssim"])
    assert ev["model"]["seed_spread"] >= 0.01


def test_demo_model_takes_the_style_palette():
    """The shipped model takes the style, from its config.json (48 held-out pairs of a seed the recipe never uses, and the
    four photographs): the output's mean colour within 0.15 of the style's (v2: 0.28; the targets 0.11),
    the sliced Wasserstein colour distance at least halfway from copy-content to the targets, the content
    kept (edge correlation >= 0.6). The transformer alone moved too (the style-colour GRPO stage), the
    palette step in config.json takes the rest of the way."""
    cfg = json.loads((DEMO_MODEL_DIR / "config.json").read_text())
    ev, photos = cfg["extra"]["evaluation"], cfg["extra"]["evaluation_photos"]
    model, copy, target = ev["model"], ev["copy-content"], ev["target"]
    assert 0 < cfg["palette"]["strength"] <= 1
    assert model["colour_dist_to_style"] <= 0.15 and photos["model"]["colour_dist_to_style"] <= 0.15
    assert model["colour_swd_to_style"] <= (copy["colour_swd_to_style"] + target["colour_swd_to_style"]) / 2
    assert model["edge_corr"] >= 0.5 and photos["model"]["edge_corr"] >= 0.6
    assert ev["transformer alone"]["colour_dist_to_style"] < 0.25  # v2's transformer: 0.288


def test_demo_model_on_held_out_real_pairs():
    """From the shipped config.json: real photographs x real styles that no training or tuning step read
    (`stylevar.evaluate.real_pairs`, results at the content's size, scored at 256 px), beside the teacher:
    colour distance to the style <= 0.06, texture at least halfway from copy-content's to the teacher's, edge
    correlation >= 0.55; the transformer alone takes the style's colours (at most 0.6 x copy-content's distance)."""
    rows = json.loads((DEMO_MODEL_DIR / "config.json").read_text())["extra"]["evaluation_real_pairs"]["rows"]
    model, alone, copy, teacher = (rows[k] for k in ("model", "transformer alone", "copy-content", "teacher (magenta)"))
    assert model["colour_swd_to_style"] <= 0.06
    assert model["texture_dist_to_style"] <= (copy["texture_dist_to_style"] + teacher["texture_dist_to_style"]) / 2
    assert model["edge_corr"] >= 0.55
    # 0.52 x copy-content's (v5: 0.65 x; v3, procedural only: 0.95 x)
    assert alone["colour_swd_to_style"] <= 0.6 * copy["colour_swd_to_style"]


def _mean_colour(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"), dtype=np.float64).reshape(-1, 3).mean(0)


@pytest.mark.slow
def test_stylize_cli_on_examples_moves_colour_toward_style(tmp_path):
    content, style = EXAMPLES / "content_horizon.png", EXAMPLES / "style_dots.png"
    out = tmp_path / "out.png"
    env_offline = {"HF_HUB_OFFLINE": "1", "NO_PROXY": "*", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "stylevar.cli", "stylize", str(content), str(style), "-o", str(out),
                           "--seed", "0"], capture_output=True, text=True, env=env_offline, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert DEMO_LABEL in proc.stderr
    assert Image.open(out).size == Image.open(content).size
    s = _mean_colour(style)
    assert np.linalg.norm(_mean_colour(out) - s) < np.linalg.norm(_mean_colour(content) - s)
