"""The real-pairs tables (`stylevar.evaluate.real_pairs.markdown`, `ceiling_markdown`) with and without the
pretrained columns: a column is shown when every row has its measure, so results recorded before a measure
existed still make a table."""
from __future__ import annotations

from stylevar.evaluate.real_pairs import (HEADERS, MEASURES, PRETRAINED_MEASURES, ceiling_markdown, markdown,
                                          measure_cells)

BASE = {"edge_corr": 0.7781, "colour_swd_to_style": 0.0291, "texture_dist_to_style": 0.0612}


def _rows(*extra: str) -> dict[str, dict]:
    more = {"sharpness": 0.29, "style_cosine": 0.9544, "style_gram_to_style": 0.312}
    return {"model": {**BASE, **{m: more[m] for m in extra}, "sec_per_image": 0.135},
            "copy-content": {**BASE, "edge_corr": 1.0, **{m: more[m] for m in extra}}}


def _table(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines()]


def test_markdown_with_the_pretrained_columns():
    table = _table(markdown({"n_pairs": 36, "score_size": 256, "rows": _rows("sharpness", *PRETRAINED_MEASURES)}))
    assert table[0] == ["36 pairs, scored at 256 px", *(HEADERS[m] for m in MEASURES + PRETRAINED_MEASURES),
                        "s / image"]
    assert table[1] == ["---"] * 8
    assert table[2] == ["model", "0.778", "0.029", "0.061", "0.290", "0.954", "0.312", "0.135"]
    assert table[3][0] == "copy-content" and table[3][-1] == "" and len(table[3]) == 8  # no time: an empty cell


def test_markdown_without_the_pretrained_columns():
    table = _table(markdown({"n_pairs": 4, "score_size": 256, "rows": _rows("sharpness")}))
    assert table[0][1:] == [*(HEADERS[m] for m in MEASURES), "s / image"]
    assert all(len(row) == 6 for row in table)
    assert table[2] == ["model", "0.778", "0.029", "0.061", "0.290", "0.135"]


def test_rows_recorded_before_a_measure_existed():
    """Earlier JSON has neither sharpness nor the pretrained measures: the three measures it has."""
    table = _table(markdown({"n_pairs": 4, "score_size": 256, "rows": _rows()}))
    assert table[0][1:] == [HEADERS["edge_corr"], HEADERS["colour_swd_to_style"], HEADERS["texture_dist_to_style"],
                            "s / image"]
    # one row without the pretrained measures: those columns are left out for all rows
    mixed = _rows("sharpness", *PRETRAINED_MEASURES)
    mixed["copy-content"] = {k: v for k, v in mixed["copy-content"].items() if k not in PRETRAINED_MEASURES}
    assert _table(ceiling_markdown(mixed))[0][1:] == [HEADERS[m] for m in MEASURES]


def test_ceiling_markdown():
    table = _table(ceiling_markdown(_rows("sharpness", *PRETRAINED_MEASURES)))
    assert table[0] == ["at 256 px", *(HEADERS[m] for m in MEASURES + PRETRAINED_MEASURES)]
    assert table[1] == ["---"] * 7
    assert table[2] == ["model", "0.778", "0.029", "0.061", "0.290", "0.954", "0.312"]  # no time column
    assert [row[0] for row in table[2:]] == ["model", "copy-content"]


def test_measure_cells_defaults_to_the_measures():
    row = _rows("sharpness")["model"]
    assert measure_cells(row) == "0.778 | 0.029 | 0.061 | 0.290"
    assert measure_cells(row, ["sharpness", "edge_corr"]) == "0.290 | 0.778"


def test_demo_card_variants_table_with_earlier_and_new_results():
    """The card's variants table (`training.demo.card.card_real`): as many cells as its header, for a
    result with the new measures and for one recorded before them."""
    from training.demo.card import Report, card_real

    real = {"n_pairs": 4, "score_size": 256, "rows": _rows("sharpness", *PRETRAINED_MEASURES), "photos": ["a"],
            "styles": ["b"], "max_side": 1024}
    earlier = {"rows": {"model": dict(BASE)}}
    card = card_real(Report({}, {}, 0, {}, {}, {}, {}, "fp32", real=real, variants={"v4": earlier, "this model": real}))
    table = _table(card.split("**Variants side by side** (the same held-out pairs):\n\n")[1].strip())
    assert [len(row) for row in table] == [5] * 4
    assert table[2] == ["v4", "0.778", "0.029", "0.061", "nan"]
    assert table[3] == ["this model", "0.778", "0.029", "0.061", "nan"]


def test_the_model_is_timed_with_every_pair_computed_whole(micro_model_dir):
    """The teacher recomputes its style for every pair: ours is timed without its condition cache (no photograph's or
    style's conditions carried from one pair to the next), and the caller's pipeline is left as it was."""
    from PIL import Image

    from stylevar.evaluate.real_pairs import run_model
    from stylevar.pipelines.pipeline import StylePipeline

    pipe = StylePipeline.from_pretrained(micro_model_dir, device="cpu")
    photo, style = Image.new("RGB", (48, 32), (90, 140, 200)), Image.new("RGB", (32, 32), (200, 60, 20))
    images, seconds = run_model(pipe, [(photo, style)] * 3, seed=0)
    assert len(images) == 3 and images[0].size == photo.size and seconds > 0
    assert pipe.conditions.enabled and pipe.conditions.stats().entries == 0
    assert images[0].tobytes() == pipe(photo, style, seed=0).tobytes()  # the same pictures as with the cache
