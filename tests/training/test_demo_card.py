"""The demo model's card (`training.demo.card`): written over the committed card from the shipped model's own
measurements, it reproduces that card byte for byte; other measurements change only the generated blocks, never
the History or the hand-written prose; with no card at the destination the default layout is written, and a card
without markers is kept whole after it."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from safetensors import safe_open

from stylevar.evaluate.real_pairs import MODEL_ROW
from stylevar.loaders.model_dir import DEMO_MODEL_DIR
from stylevar.pipelines.pipeline import StylePipeline
from training.demo.card import BLOCK_RE, BLOCKS, Report, block_names, eps_text, missing_blocks, model_card
from training.demo.export import write_model

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
COMMITTED = (DEMO_MODEL_DIR / "README.md").read_text(encoding="utf-8")
DTYPES = {"F16": "float16", "F32": "float32"}


@pytest.fixture(scope="module")
def pipe() -> StylePipeline:
    return StylePipeline.from_pretrained(DEMO_MODEL_DIR, device="cpu")


def shipped_real(pipe: StylePipeline) -> dict:
    """The held-out photographs x paintings as measured for the shipped model: the baselines' rows from
    `benchmarks/real_pairs.py`, the model's at its shipped upsampling from `benchmarks/upsample.py`."""
    real = json.loads((RESULTS / "real_pairs_v6_painted.json").read_text())
    judges = json.loads((RESULTS / "upsample_detail_judges.json").read_text())
    up = pipe.config.upsample
    real["rows"][MODEL_ROW] = judges["rows"][f"strength {up.strength:g}, eps {eps_text(up.eps)}, radius {up.radius}"]
    return real


def shipped_report(pipe: StylePipeline) -> Report:
    """What the export measured for the shipped model (its config.json's `extra`) and how its weights are stored."""
    extra = json.loads((DEMO_MODEL_DIR / "config.json").read_text())["extra"]
    with safe_open(str(DEMO_MODEL_DIR / "transformer.safetensors"), "pt") as f:
        dtype = DTYPES[f.get_slice(next(iter(f.keys()))).get_dtype()]
    return Report(extra["evaluation"], extra["evaluation_photos"], extra["n_eval"], extra["sampling_selection"],
                  extra["refinement_selection"], extra["palette_selection"], extra["training"], dtype,
                  real=shipped_real(pipe))


def hand_written(card: str) -> str:
    """The card with each generated block's body left out: what the generator must carry over."""
    return BLOCK_RE.sub(lambda m: f"[block {m.group(1)}]", card)


def headings(card: str) -> list[str]:
    return re.findall(r"^#+ .*$", card, flags=re.M)


def history(card: str) -> str:
    return card[card.index("\n## History\n"):]


def test_written_over_the_committed_card_it_reproduces_it(pipe):
    assert model_card(pipe, shipped_report(pipe), COMMITTED) == COMMITTED
    assert block_names(COMMITTED) == ["training", "model", "quality"]
    assert missing_blocks(COMMITTED) == ["stages", "details"]  # the card keeps those as History, by hand


def test_other_measurements_change_only_the_generated_blocks(pipe):
    report = shipped_report(pipe)
    report.dtype = "float32"
    report.real = copy.deepcopy(report.real)
    report.real["rows"][MODEL_ROW]["edge_corr"] = 0.5
    card = model_card(pipe, report, COMMITTED)
    assert card != COMMITTED and "**0.500**" in card and "exported these files in float32." in card
    assert "| stored as | safetensors, float32 |" in card
    assert hand_written(card) == hand_written(COMMITTED)
    assert history(card) == history(COMMITTED) and len(history(card)) > 20_000
    assert headings(card) == headings(COMMITTED)


def test_with_no_card_the_default_layout_has_every_block_in_the_committed_order(pipe):
    report = shipped_report(pipe)
    report.experiments = "## A study\n**An experiment.**"
    card = model_card(pipe, report)
    assert block_names(card) == list(BLOCKS) and missing_blocks(card) == []
    sections = [h for h in headings(card) if h.startswith("## ")]
    committed = [h for h in headings(COMMITTED) if h.startswith("## ")]
    assert sections[:3] == committed[:3] == ["## How it was trained", "## Model", "## Measured quality"]
    for text in ("Wall-clock time in all", "### Evaluation on real pictures", "### Evaluation\n",
                 "#### A study\n**An experiment.**", "](samples.png)", "](real_pairs.png)", "| **this model** | **0.851** |"):
        assert text in card, text
    assert model_card(pipe, report, card) == card  # written over itself: unchanged


def test_a_card_without_markers_is_kept_whole_and_unknown_blocks_stay(pipe):
    report = shipped_report(pipe)
    old = "# An earlier card\n\nWritten by hand.\n"
    card = model_card(pipe, report, old)
    assert card.startswith(model_card(pipe, report)) and card.endswith("\n## History\n\n"
                                                                        "The card this one replaced, as it was:\n\n" + old)
    mine = "<!-- generated: mine -->\nkept\n<!-- end generated: mine -->"
    marked = f"# Title\n\n<!-- generated: quality -->\nold\n<!-- end generated: quality -->\n\n{mine}\n"
    card = model_card(pipe, report, marked)
    assert "old" not in card and "| **this model** | **0.851** |" in card and mine in card
    assert missing_blocks(marked) == ["training", "stages", "model", "details"]


def test_the_export_writes_over_the_card_at_its_destination(pipe, tmp_path, capsys):
    (tmp_path / "README.md").write_text(COMMITTED, encoding="utf-8")
    write_model(pipe, shipped_report(pipe), tmp_path, None)
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == COMMITTED
    assert "no place for: stages, details" in capsys.readouterr().out
