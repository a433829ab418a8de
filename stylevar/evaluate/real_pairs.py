"""Real photographs x real styles, the model beside the teacher: results at the content's size, scored at 256 px.

Every photograph (long side capped at `max_side`) is stylized with every style by the full pipeline, the
transformer alone, the teacher (when installed), copy-content and Reinhard, and scored for edges kept, colour,
texture, sharpness and, with the `teacher` extra, the pretrained style measures (texture: reported, never selected on).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from stylevar.baselines.reinhard import reinhard_transfer
from stylevar.processing.images import capped_size, load_image, pil_to_tensor
from stylevar.loaders.teacher import TeacherUnavailable
from stylevar.metrics.pretrained_style import StylePredictor, compare, sharpness
from stylevar.metrics.structure import edge_correlation
from stylevar.metrics.style_fidelity import colour_swd, texture_distance
from stylevar.processing.palette import Palette
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.processing.refine import Refinement

SCORE_SIZE = 256
MEASURES = ("edge_corr", "colour_swd_to_style", "texture_dist_to_style", "sharpness")
PRETRAINED_MEASURES = ("style_cosine", "style_gram_to_style")  # with the teacher extra
MODEL_ROW, RAW_ROW, TEACHER_ROW = "model", "transformer alone", "teacher (magenta)"


def score_batch(images: list[Image.Image], size: int = SCORE_SIZE) -> torch.Tensor:
    """(B, 3, size, size) in [0, 1], bicubic."""
    return torch.stack([pil_to_tensor(im.convert("RGB").resize((size, size), Image.BICUBIC)) for im in images])


class Scorer:
    """The measures of one result set against its contents and styles (all lists of the same length)."""

    def __init__(self, pretrained: bool = True) -> None:
        self.predictor, self.why_not = None, ""
        if pretrained:
            try:
                self.predictor = StylePredictor()
            except TeacherUnavailable as e:  # the table is made without the pretrained columns
                self.why_not = str(e)

    @property
    def measures(self) -> tuple[str, ...]:
        return MEASURES + (PRETRAINED_MEASURES if self.predictor is not None else ())

    def references(self, contents: list[Image.Image], styles: list[Image.Image]) -> dict:
        refs = {"contents": score_batch(contents), "styles": score_batch(styles)}
        if self.predictor is not None:
            refs["styles_seen"] = self.predictor(refs["styles"])  # once for every result set scored against them
        return refs

    def __call__(self, images: list[Image.Image], refs: dict) -> dict[str, torch.Tensor]:
        x, contents, styles = score_batch(images), refs["contents"], refs["styles"]
        out = {"edge_corr": edge_correlation(x, contents), "colour_swd_to_style": colour_swd(x, styles),
               "texture_dist_to_style": texture_distance(x, styles), "sharpness": sharpness(x, contents)}
        if self.predictor is not None:
            pretrained = compare(self.predictor(x), refs["styles_seen"])
            out["style_cosine"], out["style_gram_to_style"] = pretrained["cosine"], pretrained["gram"]
        return out


def pick(folder: Path, names: str | None) -> list[Path]:
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png", ".webp"))
    if not names:
        return files
    chosen = [next((f for f in files if n in f.name), None) for n in names.split(",")]
    missing = [n for n, f in zip(names.split(","), chosen) if f is None]
    if missing:
        raise SystemExit(f"error: no picture named like {missing} in {folder}")
    return chosen


def capped(path: Path, max_side: int) -> Image.Image:
    img = load_image(path)
    size = capped_size(img.size, max_side)
    return img if size == img.size else img.resize(size, Image.LANCZOS)


def raw_pipeline(pipe: StylePipeline) -> StylePipeline:
    """The same model with the palette step and the refinement off."""
    return StylePipeline(pipe.model, dataclasses.replace(pipe.config, palette=Palette(), refine=Refinement()))


def run_model(pipe: StylePipeline, pairs: list[tuple[Image.Image, Image.Image]], seed: int) -> tuple[list, float]:
    """Each pair's picture and the seconds per pair, every pair computed whole, as the teacher computes its (the
    condition cache off: a photograph's or a style's conditions are not reused from one pair to the next)."""
    pipe, t0 = pipe.uncached(), time.perf_counter()
    out = [pipe(c, s, seed=seed + i) for i, (c, s) in enumerate(pairs)]
    return out, (time.perf_counter() - t0) / len(pairs)


@dataclass(frozen=True)
class RealPairs:
    """Photographs x styles: every photograph with every style."""

    photos: list[Path]
    styles: list[Path]
    max_side: int = 1024

    @classmethod
    def from_folders(cls, contents: Path, styles: Path, photos: str | None = None, art: str | None = None,
                     max_side: int = 1024) -> "RealPairs":
        return cls(pick(contents, photos), pick(styles, art), max_side)

    def load(self) -> list[tuple[Image.Image, Image.Image]]:
        photos = [capped(p, self.max_side) for p in self.photos]
        arts = [load_image(p) for p in self.styles]
        return [(c, s) for c in photos for s in arts]


def evaluate(pipe: StylePipeline, spec: RealPairs, seed: int = 0, grid_path: Path | None = None,
             grid_rows: int = 8) -> dict:
    """Means of the measures per method (`rows`), wins against the teacher per pair, and a sample grid."""
    pairs = spec.load()
    scorer = Scorer()
    refs = scorer.references([c for c, _ in pairs], [s for _, s in pairs])
    images, seconds = {}, {}
    images[MODEL_ROW], seconds[MODEL_ROW] = run_model(pipe, pairs, seed)
    images[RAW_ROW], seconds[RAW_ROW] = run_model(raw_pipeline(pipe), pairs, seed)
    from stylevar.baselines.magenta import MagentaStylizer, TeacherUnavailable
    try:
        teacher = MagentaStylizer()
        t0 = time.perf_counter()
        images[TEACHER_ROW] = [teacher(c, s) for c, s in pairs]
        seconds[TEACHER_ROW] = (time.perf_counter() - t0) / len(pairs)
    except TeacherUnavailable as e:  # the table is made without it
        print(f"[real_pairs] {e}")
    images["copy-content"] = [c for c, _ in pairs]
    images["reinhard"] = [reinhard_transfer(c, s) for c, s in pairs]
    scores = {k: scorer(v, refs) for k, v in images.items()}
    rows = {k: {m: float(v[m].mean()) for m in scorer.measures} for k, v in scores.items()}
    for k, s in seconds.items():
        rows[k]["sec_per_image"] = s
    result = {"n_pairs": len(pairs), "photos": [p.name for p in spec.photos], "styles": [p.name for p in spec.styles],
              "max_side": spec.max_side, "score_size": SCORE_SIZE, "seed": seed, "rows": rows}
    if TEACHER_ROW in scores:
        ours, theirs = scores[MODEL_ROW], scores[TEACHER_ROW]
        result["model_better_than_teacher"] = {
            "colour_swd_to_style": int((ours["colour_swd_to_style"] < theirs["colour_swd_to_style"]).sum()),
            "texture_dist_to_style": int((ours["texture_dist_to_style"] < theirs["texture_dist_to_style"]).sum()),
            "edge_corr": int((ours["edge_corr"] > theirs["edge_corr"]).sum()),
            **{m: int((ours[m] > theirs[m]).sum()) for m in ("style_cosine",) if m in ours}}
    if grid_path is not None:
        grid(pairs, images, grid_path, rows=grid_rows)
    return result


def grid(pairs, images: dict[str, list[Image.Image]], path: Path, rows: int, cell: int = 128) -> Path:
    columns = [k for k in (TEACHER_ROW, MODEL_ROW, RAW_ROW, "reinhard") if k in images]
    step = max(1, len(pairs) // rows)
    chosen = list(range(0, len(pairs), step))[:rows]
    sheet = Image.new("RGB", ((2 + len(columns)) * cell, len(chosen) * cell), "white")
    for r, i in enumerate(chosen):
        row = [pairs[i][0], pairs[i][1], *(images[k][i] for k in columns)]
        for c, im in enumerate(row):
            sheet.paste(im.convert("RGB").resize((cell, cell), Image.BICUBIC), (c * cell, r * cell))
    sheet.save(path, optimize=True)
    return path


HEADERS = {"edge_corr": "edge corr. with content ↑", "colour_swd_to_style": "colour SWD to style ↓",
           "texture_dist_to_style": "texture dist. to style ↓", "sharpness": "sharpness / content's",
           "style_cosine": "style-vector cosine ↑", "style_gram_to_style": "pretrained Gram dist. to style ↓"}


def _columns(rows: dict[str, dict]) -> list[str]:
    """The measures every row has, in table order."""
    return [m for m in MEASURES + PRETRAINED_MEASURES if all(m in r for r in rows.values())]


def measure_cells(row: dict, columns: list[str] | None = None) -> str:
    """A row's measures as markdown cells (default: MEASURES, in order)."""
    return " | ".join(f"{row[m]:.3f}" for m in (columns or MEASURES))


def markdown(result: dict) -> str:
    cols = _columns(result["rows"])
    lines = [f"| {result['n_pairs']} pairs, scored at {result['score_size']} px | "
             f"{' | '.join(HEADERS[m] for m in cols)} | s / image |", "| --- " * (len(cols) + 2) + "|"]
    for k, v in result["rows"].items():
        sec = f"{v['sec_per_image']:.3f}" if "sec_per_image" in v else ""
        lines.append(f"| {k} | {measure_cells(v, cols)} | {sec} |")
    return "\n".join(lines)


def ceiling_markdown(rows: dict[str, dict]) -> str:
    """The ceiling rows (each a method's measures, no time) as a table."""
    cols = _columns(rows)
    lines = [f"| at 256 px | {' | '.join(HEADERS[m] for m in cols)} |", "| --- " * (len(cols) + 1) + "|"]
    lines += [f"| {k} | {measure_cells(v, cols)} |" for k, v in rows.items()]
    return "\n".join(lines)
