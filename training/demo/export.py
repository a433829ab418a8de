"""The demo model's evaluation and export (`python -m training.demo`, whose doc says what it does): the held-out
synthetic triplets and photographs, the choices of sampling, refinement and palette step on training
triplets, the tables against the weight-free baselines, the real pairs beside the teacher; the model card is
`training.demo.card`'s."""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from data_tools import synth
from stylevar.baselines.reinhard import reinhard_transfer
from stylevar.evaluate.benchmarks import load_benchmark
from stylevar.evaluate.scoring import Scored, batch_slices, score_batches
from stylevar.config import DEFAULT_GENERATION
from stylevar.processing.images import load_image, pil_to_tensor
from stylevar.metrics.structure import edge_correlation
from stylevar.metrics.style_fidelity import colour_swd, texture_distance
from stylevar.processing.palette import Palette, match_palette
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.processing.refine import Refinement, refine
from stylevar.evaluate.real_pairs import RAW_ROW, RealPairs
from stylevar.evaluate.real_pairs import evaluate as evaluate_real, markdown as real_markdown
from stylevar.utils.threads import apply_threads
from training.demo.card import MIN_SEED_SPREAD, Report, missing_blocks, model_card, palette_label, table_markdown

BASE_METRICS = ("ssim", "ssim_standard")
OPTIONAL_METRICS = ("lpips", "dreamsim", "clip")
HELDOUT_SEED = 424242  # synthesis seed of the held-out pairs: the recipe's data uses seed 0
PHOTOS = Path(__file__).resolve().parents[2] / "stylevar" / "assets" / "photos"
PHOTO_NAMES = ("astronaut", "coffee", "chelsea", "rocket")


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
    """The top-k/top-p with the best SSIM on training `triplets` among those with a seed spread of at least
    `MIN_SEED_SPREAD` (else the most random), and every candidate's scores."""
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
    """The refinement with the best SSIM on training `triplets`, and every candidate's scores (refinement off)."""
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


def mean_colour_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance of the mean RGB colours ([0, 1]) of two image batches, (B,)."""
    return (a.mean(dim=(2, 3)) - b.mean(dim=(2, 3))).norm(dim=1)


def choose_palette(pipe: StylePipeline, triplets: list[Triplet], refinement: Refinement, seed: int = 0
                   ) -> tuple[Palette, dict]:
    """The palette step nearest the style's colours that keeps the content's edges as the targets do."""
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
    """The model on `triplets` (seed + index each), batch by batch, timed and scored by `scorer`."""
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
    """Per-sample metrics of outputs for `triplets` at `size` px (a runner's `score`); against targets if any."""
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
    """Mean metrics of copy-content, Reinhard, the content through `palette` (when on) and the targets."""
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
    """Mean of each metric per method: the model (with seconds per image, seed spread) and the baselines."""
    return {"model": evaluate_model(pipe, triplets, seed, suite),
            **score_baselines(triplets, pipe.image_size, suite, pipe.config.palette)}


def sample_grid(pipe: StylePipeline, triplets: list[Triplet], path: Path, seed: int = 0, cell: int = 64) -> Path:
    """A picture grid, a row per triplet: content, style, target, the model (two seeds), transformer alone, Reinhard."""
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


def half_precision_ssim(pipe: StylePipeline, triplets: list[Triplet], seed: int) -> float:
    """The SSIM to the target of the model stored in float16 and loaded back (same seeds)."""
    with tempfile.TemporaryDirectory() as tmp:
        pipe.save_pretrained(tmp, dtype=torch.float16)
        half = StylePipeline.from_pretrained(tmp, device="cpu")  # keeps the chosen sampling settings
        return ssim_to_target(outputs(generate(half, triplets, seed)), triplets)


def choose_settings(pipe: StylePipeline, calibration: list[Triplet], args: argparse.Namespace
                    ) -> tuple[Refinement, Palette, dict[str, dict]]:
    """Sampling (set on `pipe`), refinement and palette step chosen on the calibration triplets, with scores."""
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
    selections = {"sampling": {"n": len(calibration), "scores": scores},
                  "refinement": {"n": len(calibration), "scores": refine_scores}, "palette": palette_selection}
    return chosen, palette, selections


def evaluate_tables(pipe: StylePipeline, triplets: list[Triplet], photos: list[Triplet], refinement: Refinement,
                    palette: Palette, seed: int) -> tuple[dict[str, dict], dict[str, dict]]:
    """The synthetic and the photographs' tables with `refinement` and `palette` set on `pipe`; with either on,
    the transformer's own output (measured before they are set) as the row `RAW_ROW` next to the shipped one."""
    suite = make_suite()
    raw = {"synthetic": evaluate_model(pipe, triplets, seed, suite), "photos": evaluate_model(pipe, photos, seed)}
    pipe.config.refine, pipe.config.palette = refinement, palette
    table = evaluate(pipe, triplets, seed, suite=suite)
    photo_table = evaluate(pipe, photos, seed)
    if refinement.enabled or palette.enabled:  # the transformer's own output next to the shipped one
        table, photo_table = ({"model": t["model"], RAW_ROW: raw[k], **{m: v for m, v in t.items() if m != "model"}}
                              for t, k in ((table, "synthetic"), (photo_table, "photos")))
    return table, photo_table


def evaluate_real_pairs(pipe: StylePipeline, args: argparse.Namespace) -> tuple[dict | None, dict[str, dict]]:
    """The held-out real pairs (`--real-contents`) and the variants set beside this model (`--compare`)."""
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
    return real, variants


def write_model(pipe: StylePipeline, report: Report, out: Path, dtype: torch.dtype | None) -> None:
    """Save the model with its card, written over the card already at `out` (`training.demo.card`'s rule)."""
    path = out / "README.md"
    existing = path.read_text(encoding="utf-8") if path.is_file() else None
    pipe.save_pretrained(out, dtype=dtype, model_card=model_card(pipe, report, existing))
    if missing := missing_blocks(existing):
        print(f"card: {path} keeps its own layout, which has no place for: {', '.join(missing)}")


def export(args: argparse.Namespace) -> int:
    """`python -m training.demo` with its parsed options (the command's doc)."""
    apply_threads(args.threads or "torch")  # None: torch's count (or OMP_NUM_THREADS) as it is
    pipe = StylePipeline.from_pretrained(args.model, device="cpu")
    if args.upsample_strength is not None:  # the recipe's choice (benchmarks.upsample detail): every table has it
        pipe.config.upsample = dataclasses.replace(pipe.config.upsample, strength=args.upsample_strength)
    calibration = load_triplets(args.data, args.calibration, split="train")
    chosen, palette, selections = choose_settings(pipe, calibration, args)
    triplets, photos = heldout_triplets(args.n, pipe.image_size), photo_triplets(pipe.image_size)
    table, photo_table = evaluate_tables(pipe, triplets, photos, chosen, palette, args.seed)

    # float16 storage if it keeps the evaluation (same seeds) within 0.002 SSIM
    half_ssim = half_precision_ssim(pipe, triplets, args.seed)
    use_fp16 = math.isfinite(half_ssim) and abs(half_ssim - table["model"]["ssim"]) < 0.002
    timings = json.loads(args.timings.read_text()) if args.timings and args.timings.is_file() else {}
    timings.setdefault("eval_device", "cpu")
    pipe.config.demo = True
    pipe.config.name = "stylevar-demo"
    pipe.config.extra = {"evaluation": table, "evaluation_photos": photo_table, "n_eval": len(triplets),
                         "heldout_seed": HELDOUT_SEED, "fp16_ssim": half_ssim,
                         "sampling_selection": selections["sampling"], "refinement_selection": selections["refinement"],
                         "palette_selection": selections["palette"], "training": timings}
    real, variants = evaluate_real_pairs(pipe, args)
    report = Report(table, photo_table, len(triplets), selections["sampling"], selections["refinement"],
                    selections["palette"], timings, "float16" if use_fp16 else "float32",
                    args.experiments.read_text() if args.experiments else "",
                    real=real, ceiling=json.loads(args.ceiling.read_text()) if args.ceiling else None,
                    variants=variants)
    write_model(pipe, report, args.out, torch.float16 if use_fp16 else None)
    sample_grid(pipe, triplets[:6] + photos, args.out / "samples.png", args.seed)
    print(table_markdown(table))
    print(table_markdown(photo_table))
    print(f"wrote {args.out} ({'float16' if use_fp16 else 'float32'}; fp16 SSIM {half_ssim:.4f} vs "
          f"{table['model']['ssim']:.4f})")
    if table["model"]["ssim"] < table["reinhard"]["ssim"]:
        print("warning: the model's SSIM to the target is below Reinhard's", file=sys.stderr)
        return 1
    return 0
