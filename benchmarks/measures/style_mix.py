"""The measurements of `python -m benchmarks.style_mix` (its docstring says what each is): masks, weights and
guidance on held-out pairs and the bundled photographs, their tables and the example figures."""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image, ImageDraw

from stylevar.processing.images import pil_to_tensor
from stylevar.metrics.structure import edge_correlation, ssim_standard
from stylevar.pipelines.pipeline import StyleMix, StylePipeline
from stylevar.processing.refine import Refinement
from training.parts.demo_export import Triplet, heldout_triplets, photo_triplets

WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)
GUIDANCE = (0.0, 0.25, 0.5, 1.0, 2.0)


@dataclass
class Case:
    """One content with its two styles."""

    content: Image.Image
    style_a: Image.Image
    style_b: Image.Image


def cases(n: int, size: int) -> list[Case]:
    pairs: list[Triplet] = heldout_triplets(n, size) + photo_triplets(size)
    return [Case(t.content, t.style, pairs[(i + 1) % len(pairs)].style) for i, t in enumerate(pairs)]


def square(img: Image.Image, size: int) -> torch.Tensor:
    """(3, size, size) in [0, 1] (the content stretched, as the pipeline's default resize does)."""
    return pil_to_tensor(img.convert("RGB").resize((size, size), Image.BILINEAR))


def half_mask(size: tuple[int, int], left: bool) -> Image.Image:
    """White on the left (or right) half of a picture of `size`, black elsewhere."""
    mask = Image.new("L", size, 0)
    w, h = size
    ImageDraw.Draw(mask).rectangle((0, 0, w // 2 - 1, h) if left else (w // 2, 0, w, h), fill=255)
    return mask


def half_region(size: int, left: bool) -> torch.Tensor:
    region = torch.zeros(size, size, dtype=torch.bool)
    region[:, : size // 2] = True
    return region if left else ~region


def mean_colour(img_3HW: torch.Tensor, region_HW: torch.Tensor | None = None) -> torch.Tensor:
    return img_3HW.flatten(1).mean(1) if region_HW is None else img_3HW[:, region_HW].mean(1)


class Runner:
    """The model's outputs for every case and seed, as (3, S, S) tensors in [0, 1]."""

    def __init__(self, pipe: StylePipeline, cs: list[Case], seeds: int):
        self.pipe, self.cases, self.seeds = pipe, cs, list(range(seeds))
        self.size = pipe.image_size

    def outputs(self, mix_of, **gen) -> list[list[torch.Tensor]]:
        """[case][seed] -> output; `mix_of(case)` gives the case's style (an image or a StyleMix)."""
        contents = [c.content for c in self.cases for _ in self.seeds]
        styles = [mix_of(c) for c in self.cases for _ in self.seeds]
        seeds = [1000 * i + s for i in range(len(self.cases)) for s in self.seeds]
        images = self.pipe.stylize_batch(contents, styles, seeds=seeds, max_side=self.size, **gen)
        flat = [square(im, self.size) for im in images]
        k = len(self.seeds)
        return [flat[i * k:(i + 1) * k] for i in range(len(self.cases))]


def measure_masks(r: Runner) -> dict:
    S = r.size
    rows: dict[str, list[float]] = {k: [] for k in ("inside", "outside", "plain_inside", "plain_outside",
                                                    "two_a_in_a", "two_a_in_b")}
    plain = r.outputs(lambda c: c.style_a)
    for left in (True, False):
        inside, outside = half_region(S, left), ~half_region(S, left)
        masked = r.outputs(lambda c: StyleMix((c.style_a,), masks=(half_mask(c.content.size, left),)))
        two = r.outputs(lambda c: StyleMix((c.style_a, c.style_b), masks=(half_mask(c.content.size, left),
                                                                           half_mask(c.content.size, not left))))
        for i, c in enumerate(r.cases):
            a = mean_colour(square(c.style_a, S))
            for s in range(len(r.seeds)):
                rows["inside"].append(float((mean_colour(masked[i][s], inside) - a).norm()))
                rows["outside"].append(float((mean_colour(masked[i][s], outside) - a).norm()))
                rows["plain_inside"].append(float((mean_colour(plain[i][s], inside) - a).norm()))
                rows["plain_outside"].append(float((mean_colour(plain[i][s], outside) - a).norm()))
                rows["two_a_in_a"].append(float((mean_colour(two[i][s], inside) - a).norm()))
                rows["two_a_in_b"].append(float((mean_colour(two[i][s], outside) - a).norm()))
    out = {k: sum(v) / len(v) for k, v in rows.items()}
    out["inside_smaller_share"] = sum(i < o for i, o in zip(rows["inside"], rows["outside"])) / len(rows["inside"])
    return out


def measure_weights(r: Runner) -> list[dict]:
    S, table = r.size, []
    for w in WEIGHTS:
        outs = r.outputs(lambda c: StyleMix((c.style_a, c.style_b), weights=(w, 1.0 - w)))
        pos, da, db = [], [], []
        for i, c in enumerate(r.cases):
            a, b = mean_colour(square(c.style_a, S)), mean_colour(square(c.style_b, S))
            for out in outs[i]:
                m = mean_colour(out)
                pos.append(float((m - b).dot(a - b) / (a - b).dot(a - b).clamp_min(1e-8)))
                da.append(float((m - a).norm()))
                db.append(float((m - b).norm()))
        table.append({"w": w, "position_b_to_a": sum(pos) / len(pos), "dist_to_a": sum(da) / len(da),
                      "dist_to_b": sum(db) / len(db)})
    return table


def guidance_scores(r: Runner, g: float) -> dict[str, float]:
    """At guidance g: colour distance to style A (lower = more style), and two measures of content fidelity,
    edge correlation with the content and SSIM to the content (`ssim_standard`), means over the outputs."""
    S, scores = r.size, {"colour_dist_to_style": [], "edge_corr": [], "ssim_to_content": []}
    outs = r.outputs(lambda c: c.style_a, guidance=g)
    for i, c in enumerate(r.cases):
        a, content = mean_colour(square(c.style_a, S)), square(c.content, S)
        for out in outs[i]:
            scores["colour_dist_to_style"].append(float((mean_colour(out) - a).norm()))
            scores["edge_corr"].append(float(edge_correlation(out[None], content[None])[0]))
            scores["ssim_to_content"].append(float(ssim_standard(out[None], content[None]).mean()))
    return {k: sum(v) / len(v) for k, v in scores.items()}


def measure_guidance(r: Runner) -> list[dict]:
    """Each guidance value as the pipeline returns it and, when the model has a refinement step, with that
    step off (what the transformer drew)."""
    table = []
    refine = r.pipe.config.refine
    for g in GUIDANCE:
        row = {"guidance": g, **guidance_scores(r, g)}
        if refine.enabled:
            r.pipe.config.refine = Refinement()
            try:
                row.update({k + "_raw": v for k, v in guidance_scores(r, g).items()})
            finally:
                r.pipe.config.refine = refine
        table.append(row)
    return table


def monotonic(values: list[float], increasing: bool) -> bool:
    return all((b > a) if increasing else (b < a) for a, b in zip(values, values[1:]))


def markdown(res: dict) -> str:
    m = res["mask"]
    lines = [f"Model `{res['model']}`, {res['cases']} contents x {res['seeds']} seeds, at {res['size']} px "
             f"({res['seconds']:.0f} s on {res['device']}). Colour distance: between mean RGB colours in [0, 1].", "",
             "**Mask** (style A on one half, the content alone on the other; both halves in turn)", "",
             "| colour distance to style A | inside A's mask | outside it |", "| --- | ---: | ---: |",
             f"| A masked to one half | {m['inside']:.3f} | {m['outside']:.3f} |",
             f"| A everywhere (no mask): the same halves | {m['plain_inside']:.3f} | {m['plain_outside']:.3f} |",
             f"| A and B on complementary halves | {m['two_a_in_a']:.3f} | {m['two_a_in_b']:.3f} (B's half) |", "",
             f"Inside smaller than outside in {100 * m['inside_smaller_share']:.0f}% of the masked results.", "",
             "**Weights** (A at weight w, B at 1 - w; position 0 = B's mean colour, 1 = A's)", "",
             "| w | position B -> A | distance to A | distance to B |", "| ---: | ---: | ---: | ---: |"]
    lines += [f"| {row['w']:g} | {row['position_b_to_a']:.3f} | {row['dist_to_a']:.3f} | {row['dist_to_b']:.3f} |"
              for row in res["weights"]]
    pos = [row["position_b_to_a"] for row in res["weights"]]
    lines += ["", f"Monotonic from B toward A: {'yes' if monotonic(pos, True) else 'no'}.", "",
              "**Guidance** (style A; lower colour distance = more style; lower edge correlation and lower SSIM "
              "to the content = less content; \"refinement off\": the transformer's output before the model's "
              "content-guided refinement)", ""]
    raw = "edge_corr_raw" in res["guidance"][0]
    suffixes = ("", "_raw") if raw else ("",)
    cols = ("colour_dist_to_style", "edge_corr", "ssim_to_content")
    names = ("colour distance to style", "edge correlation with content", "SSIM to content")
    head = [f"{name}{', refinement off' if suffix else ''}" for suffix in suffixes for name in names]
    lines += ["| guidance | " + " | ".join(head) + " |", "| ---: |" + " ---: |" * len(head)]
    for row in res["guidance"]:
        lines.append(f"| {row['guidance']:g} | " + " | ".join(f"{row[c + suffix]:.3f}" for suffix in suffixes
                                                             for c in cols) + " |")
    lines.append("")
    gs = [row["guidance"] for row in res["guidance"]]
    for suffix in suffixes:
        dist = [row["colour_dist_to_style" + suffix] for row in res["guidance"]]
        for fidelity, what in (("edge_corr", "edge correlation"), ("ssim_to_content", "SSIM to the content")):
            values = [row[fidelity + suffix] for row in res["guidance"]]
            n = max(k for k in range(1, len(gs) + 1) if monotonic(dist[:k], False) and monotonic(values[:k], False))
            lines.append(f"{'Refinement off' if suffix else 'As returned'}, content by {what}: style rises and "
                         "content fidelity falls, both monotonically, over "
                         + (f"guidance {', '.join(f'{g:g}' for g in gs[:n])} ({n} values)." if n > 1
                            else "no range from 0."))
    lines.append("")
    return "\n".join(lines)


# ---- figures ------------------------------------------------------------------------------------------------
def strip(cells: list[tuple[str, Image.Image]], cell: int = 128) -> Image.Image:
    """Labelled cells side by side (nearest-neighbour upscaling: the model's pixels as they are)."""
    pad, label_h = 6, 16
    sheet = Image.new("RGB", (len(cells) * (cell + pad) + pad, cell + label_h + 2 * pad), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for i, (label, img) in enumerate(cells):
        x = pad + i * (cell + pad)
        sheet.paste(img.convert("RGB").resize((cell, cell), Image.NEAREST), (x, pad + label_h))
        draw.rectangle((x - 1, pad + label_h - 1, x + cell, pad + label_h + cell), outline=(160, 160, 160))
        draw.text((x + 2, pad), label, fill=(0, 0, 0))
    return sheet


def figures(pipe: StylePipeline, case: Case, out_dir: Path, seed: int = 0) -> list[Path]:
    S = pipe.image_size

    def one(style, **gen) -> Image.Image:
        return pipe.stylize_batch([case.content], [style], seeds=[seed], max_side=S, **gen)[0]

    def fit(img: Image.Image) -> Image.Image:
        return img.convert("RGB").resize((S, S), Image.BILINEAR)

    left = half_mask(case.content.size, True)
    right = half_mask(case.content.size, False)
    out_dir.mkdir(parents=True, exist_ok=True)
    blend = [("content", fit(case.content)), ("style A", fit(case.style_a)), ("style B", fit(case.style_b))]
    blend += [(f"w(A) = {w:g}", one(StyleMix((case.style_a, case.style_b), (w, 1 - w)))) for w in WEIGHTS]
    mask = [("content", fit(case.content)), ("mask (A)", fit(left)), ("style A", fit(case.style_a)),
            ("A on the left", one(StyleMix((case.style_a,), masks=(left,)))), ("style B", fit(case.style_b)),
            ("A left, B right", one(StyleMix((case.style_a, case.style_b), masks=(left, right))))]
    guide = [("content", fit(case.content)), ("style", fit(case.style_a))]
    guide += [(f"guidance {g:g}", one(case.style_a, guidance=g)) for g in GUIDANCE]
    paths = []
    for name, cells in (("style_mix_blend", blend), ("style_mix_mask", mask), ("style_mix_guidance", guide)):
        path = out_dir / f"{name}.png"
        strip(cells).save(path)
        paths.append(path)
    return paths


def execute(args: argparse.Namespace) -> int:
    """`python -m benchmarks.style_mix` once its options are read: the three measurements (OUT.json, OUT.md,
    printed) and the figures."""
    torch.manual_seed(0)
    pipe = StylePipeline.from_pretrained(args.model, device=args.device)
    cs = cases(args.n, pipe.image_size)
    if args.figures_only:
        for path in figures(pipe, cs[args.figure_case], Path(args.figures)):
            print(f"wrote {path}")
        return 0
    runner = Runner(pipe, cs, args.seeds)
    t0 = time.perf_counter()
    res = {"model": pipe.config.name, "cases": len(cs), "seeds": args.seeds, "size": pipe.image_size,
           "device": str(pipe.device), "mask": measure_masks(runner), "weights": measure_weights(runner),
           "guidance": measure_guidance(runner)}
    res["seconds"] = time.perf_counter() - t0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))
    if args.figures:
        for path in figures(pipe, cs[args.figure_case], Path(args.figures)):
            print(f"wrote {path}")
    return 0

