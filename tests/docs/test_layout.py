"""The repository reads as a product: a README of one front page, reference pages a reader can hold, no dated
figures or build-machine talk outside the places made for measurements (the benchmarks' results and the demo
model's card), and one file per benchmark."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("stylevar", "training", "serve", "web", "data_tools", "benchmarks", "scripts")
MAX_README_LINES = 200
MAX_DOC_LINES = 450
# measurements carry their date where they are recorded, nowhere else
MEASUREMENT_RECORDS = ("benchmarks/README.md", "benchmarks/results/", "stylevar/assets/demo/README.md")
DATED_OR_BUILD_TALK = re.compile(r"\blent\b|device time|20[0-9]{2}-[01][0-9]-[0-3][0-9]", re.IGNORECASE)
TEXT_SUFFIXES = {".py", ".md", ".sh", ".toml", ".yaml", ".yml", ".txt", ".json", ".cfg", ".html", ".js", ".css"}


def product_text_files() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    for root in PRODUCT:
        files += sorted(p for p in (REPO / root).rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES
                        and "__pycache__" not in p.parts)
    return [p for p in files if not p.relative_to(REPO).as_posix().startswith(MEASUREMENT_RECORDS)]


def test_the_readme_is_one_front_page():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; reference belongs under docs/"


@pytest.mark.parametrize("page", sorted(p.name for p in (REPO / "docs").glob("*.md")))
def test_each_reference_page_is_one_a_reader_can_hold(page):
    lines = len((REPO / "docs" / page).read_text().splitlines())
    assert lines <= MAX_DOC_LINES, f"docs/{page} has {lines} lines (at most {MAX_DOC_LINES}): split it by surface"


def test_dates_and_build_machines_stay_out_of_the_product():
    hits = [f"{p.relative_to(REPO)}:{n}: {line.strip()[:80]}" for p in product_text_files()
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if DATED_OR_BUILD_TALK.search(line)]
    assert not hits, ("dated figures belong in benchmarks/README.md, benchmarks/results/ or the demo model's card:\n"
                      + "\n".join(hits))


def test_one_file_per_benchmark():
    files = [p for p in (REPO / "benchmarks").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert not (REPO / "benchmarks" / "measures").exists()
    stems: dict[str, list[str]] = {}
    for p in files:
        stems.setdefault(p.name.split(".")[0], []).append(p.relative_to(REPO).as_posix())
    shared = {stem: paths for stem, paths in stems.items() if len(paths) > 1}
    assert not shared, f"files under benchmarks/ sharing a name stem: {shared}"
