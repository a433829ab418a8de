"""The demo model's card (its README.md), written by `training.demo.export` from what the run measured.

Between `<!-- generated: NAME -->` and `<!-- end generated: NAME -->` (NAME one of `BLOCKS`) the card is the
generator's: the export's choices, the training stages, the model's settings, the quality table and the full
evaluation. Every other line (title, hand-written prose, History) is carried over verbatim from the card already at
the destination. A block that card has no markers for is not written (its layout decides); with no card there, the
default layout (`fresh_card`) is written, and a card without markers is kept whole under "## History" after it.
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

from stylevar.evaluate.real_pairs import MODEL_ROW, RAW_ROW, TEACHER_ROW, ceiling_markdown, measure_cells
from stylevar.evaluate.real_pairs import markdown as real_markdown
from stylevar.loaders.model_dir import DEMO_LABEL

if TYPE_CHECKING:
    from stylevar.pipelines.pipeline import StylePipeline
    from stylevar.processing.palette import Palette

MIN_SEED_SPREAD = 0.01  # mean |pixel difference| between two seeds' outputs, [0, 1] scale (the sampling rule)
BLOCKS = ("training", "stages", "model", "quality", "details")
PALETTE_MOVES = {"moments": "Lab mean and standard deviation", "distribution": "Lab colour distribution"}  # by method
BLOCK_RE = re.compile(r"^<!-- generated: ([\w-]+) -->\n.*?^<!-- end generated: \1 -->$", re.M | re.S)


def palette_label(cfg: Palette) -> str:
    """"off", "moments 0.6", "distribution 1": the key of a candidate in the selection's scores."""
    return f"{cfg.method} {cfg.strength:g}" if cfg.enabled else "off"


ARROWS = {"edge_corr": "↑", "ssim": "↑", "ssim_standard": "↑", "l1": "↓", "colour_dist_to_style": "↓",
          "colour_swd_to_style": "↓", "texture_dist_to_style": "↓",
          "lpips": "↓", "dreamsim": "↓", "clip": "↑", "seed_spread": "", "sec_per_image": "↓"}


def markdown_table(header: list[str], rows: Iterable[list[str]]) -> str:
    """A markdown table: the header's cells, then each row's."""
    return "\n".join("| " + " | ".join(cells) + " |" for cells in [header, ["---"] * len(header), *rows])


def table_markdown(table: dict[str, dict]) -> str:
    cols = [c for c in ARROWS if any(c in row for row in table.values())]
    rows = ([method, *(f"{row[c]:.4f}" if c in row else "-" for c in cols)] for method, row in table.items())
    return markdown_table(["method", *(f"{c} {ARROWS[c]}".strip() for c in cols)], rows)


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


def block(name: str, body: str) -> str:
    """`body` between the markers of the generated block `name`."""
    return f"<!-- generated: {name} -->\n\n{body.strip()}\n\n<!-- end generated: {name} -->"


def block_names(card: str) -> list[str]:
    """The generated blocks a card has, in order."""
    return [m.group(1) for m in BLOCK_RE.finditer(card)]


def missing_blocks(card: str | None) -> list[str]:
    """The generated blocks a marked card has no place for (none for no card, or one without markers)."""
    names = block_names(card or "")
    return [name for name in BLOCKS if names and name not in names]


def model_card(pipe: StylePipeline, r: Report, existing: str | None = None) -> str:
    """The demo model's card, written over `existing` (the card at the destination, if any) by the module's rule."""
    bodies = generated_blocks(pipe, r)
    if existing is None:
        return fresh_card(pipe, bodies)
    if not block_names(existing):
        return fresh_card(pipe, bodies) + "\n## History\n\nThe card this one replaced, as it was:\n\n" + existing
    return BLOCK_RE.sub(lambda m: block(m.group(1), bodies[m.group(1)]) if m.group(1) in bodies else m.group(0),
                        existing)


def generated_blocks(pipe: StylePipeline, r: Report) -> dict[str, str]:
    """Each generated block's text, by name (`BLOCKS`)."""
    return {"training": training_choices(pipe, r), "stages": stages_text(r), "model": model_table(pipe, r),
            "quality": quality_table(r.real), "details": details(pipe, r)}


TEMPLATES = Path(__file__).with_name("templates")  # the card's prose: card.md (the default layout), evaluation.md,
# selection.md; `str.format` fields in braces


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.md").read_text(encoding="utf-8")


def fresh_card(pipe: StylePipeline, bodies: dict[str, str]) -> str:
    """The default layout (templates/card.md): the title and what the model is, then each section with its blocks."""
    blocks = {name: block(name, body) for name, body in bodies.items()}
    return template("card").format(label=DEMO_LABEL, size=pipe.config.tokenizer.image_size, **blocks)


def eps_text(eps: float) -> str:
    """0.001 -> "1e-3"."""
    mantissa, _, exponent = f"{eps:.0e}".partition("e")
    return f"{mantissa}e{int(exponent)}"


def palette_choice_text(pal: Palette) -> str:
    """What the palette step does, in words (the export's choice)."""
    if not pal.enabled:
        return "off"
    if pal.strength >= 1:
        return f"the whole {PALETTE_MOVES[pal.method]} moved to the style's"
    return f"the {PALETTE_MOVES[pal.method]} moved {pal.strength:.0%} of the way to the style's"


def training_choices(pipe: StylePipeline, r: Report) -> str:
    """The block "training": what `python -m training.demo` chose on training triplets, and the storage."""
    gen, ref = pipe.config.generation, pipe.config.refine
    refinement = f"radius {ref.radius}, eps {eps_text(ref.eps)}" if ref.enabled else "off"
    text = (f"`python -m training.demo` then chose the sampling (top-k {gen.get('top_k')}, top-p {gen.get('top_p')}), "
            f"the content-guided refinement ({refinement}) and the palette step "
            f"({palette_choice_text(pipe.config.palette)}) on training triplets, and exported these files in {r.dtype}.")
    return textwrap.fill(text, 115, break_on_hyphens=False, break_long_words=False)


def stages_text(r: Report) -> str:
    """The block "stages": the recipe, the machine and each stage's time and command."""
    stages = "\n".join(f"| {k} | {v.get('seconds', 0) / 60:.1f} min | `{v.get('command', '')}` |"
                       for k, v in r.timings.get("stages", {}).items())
    provenance = r.timings.get("note") or "it reproduces this model from scratch."
    return f"""Recipe: `scripts/train_demo_model.sh` (seed {r.timings.get('seed', 0)}); {provenance}
Machine: {r.timings.get('machine', 'unknown')}. Wall-clock time in all: {r.timings.get('total_seconds', 0) / 60:.1f} min.

| stage | time | command |
| --- | --- | --- |
{stages}"""


def model_table(pipe: StylePipeline, r: Report) -> str:
    """The block "model": the architecture, the post-processing and the storage."""
    tr, vq = pipe.config.transformer, pipe.config.tokenizer
    params = sum(p.numel() for p in pipe.model.parameters())
    injection = ("content injection on (`content_injection`: the content's tokens are also added to the target's "
                 "inputs through a zero-initialised linear map; an opt-in variant, not the published architecture)"
                 if tr.content_injection else "published architecture")
    ref, pal = pipe.config.refine, pipe.config.palette
    rounds = f" ({pal.iterations} rounds of iterative distribution transfer)" if pal.method == "distribution" else ""
    palette_row_text = (f"{palette_label(pal)} (`stylevar.processing.palette`): the output's {PALETTE_MOVES[pal.method]} "
                        f"moved {pal.strength:.0%} of the way to the style's{rounds}" if pal.enabled else "none")
    refinement_row = (f"guided filter with the content as the guide (`stylevar.processing.refine`), radius {ref.radius} px, "
                      f"eps {ref.eps:g}: the content's edges put back into the output, colours unchanged"
                      if ref.enabled else "none")
    return f"""| | |
| --- | --- |
| tokenizer | multi-scale VQ-VAE, {vq.image_size} px, {vq.image_size // vq.downsample} x {vq.image_size // vq.downsample} latent, scales {list(vq.patch_nums)}, codebook {vq.vocab_size} x {vq.z_channels}, ch {vq.ch} x {list(vq.ch_mult)} |
| transformer | depth {tr.depth}, width {tr.embed_dim}, {tr.num_heads} heads, {tr.image_encoder} image encoders, alphas {list(tr.alpha_nums)} |
| variant | {injection} |
| refinement | {refinement_row} |
| palette step | {palette_row_text} |
| parameters | {params / 1e6:.2f} M (tokenizer included) |
| stored as | safetensors, {r.dtype} |
| recommended sampling | top-k {pipe.config.generation.get("top_k")}, top-p {pipe.config.generation.get("top_p")} (config.json `generation`; callers may override) |"""


# the quality table's rows (a real-pairs result's row -> its label) and measures (-> header, decimals), in order
QUALITY_ROWS = {"copy-content": "copy-content (the photograph unchanged)", "reinhard": "reinhard (colour transfer)",
                TEACHER_ROW: "the teacher (Magenta)", MODEL_ROW: "**this model**"}
QUALITY_MEASURES = {"edge_corr": ("edge corr. ↑", 3), "colour_swd_to_style": ("colour SWD ↓", 3),
                    "sharpness": ("sharpness / content's", 2), "style_cosine": ("style-vector cosine ↑", 3),
                    "style_gram_to_style": ("pretrained Gram dist. ↓", 3)}


def quality_table(real: dict | None) -> str:
    """The block "quality": the model beside the baselines on the held-out real pairs (the measures every row has)."""
    if not real:
        return "Not measured: the export was given no held-out real pairs (`--real-contents`)."
    rows = {k: real["rows"][k] for k in QUALITY_ROWS if k in real["rows"]}
    cols = [m for m in QUALITY_MEASURES if all(m in row for row in rows.values())]
    bold = {key: "**" if key == MODEL_ROW else "" for key in rows}
    body = ([QUALITY_ROWS[k], *(f"{bold[k]}{row[m]:.{QUALITY_MEASURES[m][1]}f}{bold[k]}" for m in cols)]
            for k, row in rows.items())
    return markdown_table([f"{real['n_pairs']} held-out pairs", *(QUALITY_MEASURES[m][0] for m in cols)], body)


def details(pipe: StylePipeline, r: Report) -> str:
    """The block "details": the sample grids and every table the export measured, with how each choice was made."""
    nested = re.sub(r"^#", "###", r.experiments.strip(), flags=re.M)  # its headings under the one below
    experiments = f"\n### Experiments behind this model\n{nested}\n" if nested else ""
    return grids(pipe, r) + card_real(r) + evaluation_tables(pipe, r) + selection_tables(r) + experiments


def grids(pipe: StylePipeline, r: Report) -> str:
    """The sample grids the export writes beside the card, with their captions."""
    raw_column = ", the transformer alone (seed 0)" if pipe.config.refine.enabled or pipe.config.palette.enabled else ""
    real = """![content, style, teacher, the model, the transformer alone, Reinhard](real_pairs.png)

*Held-out real photographs x real styles. Columns: content, style, the teacher (Magenta), this model (what
the service returns), the transformer alone (palette step and refinement off), Reinhard colour transfer.*
Pictures of the grid: KDE's `plasma-workspace-wallpapers` (each wallpaper's `metadata.json`: LGPL-3 or CC-BY-SA-4.0; KDE Visual Design Group and the named authors) and `ukui-wallpapers` (CC-BY-SA-3.0, Ubuntu Kylin community contributors), Debian packages; the grid, derived from them, is under the same terms (share-alike).

""" if r.real else ""
    return f"""{real}![content, style, target, the model with seeds 0 and 1{raw_column}, Reinhard](samples.png)

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
    text = f"""### Evaluation on real pictures
Held-out pairs: {len(r.real["photos"])} photographs x {len(r.real["styles"])} styles from Debian's `plasma-workspace-wallpapers` and
`ukui-wallpapers` (never used for training or tuning), each photograph's long side capped at
{r.real["max_side"]} px. Every method returns the content's size; results, content and style are brought to 256 x 256
and scored (`stylevar.evaluate.real_pairs`, `benchmarks/real_pairs.py`): edge correlation with the content,
colour SWD (Lab, `colour_swd`) and texture distance (`texture_distance`) to the style. Seconds per image:
one image at a time on the CPU, each computed whole (upsampling to the content's size included).

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
        table = markdown_table(["model (held-out real pairs)", "edge corr. ↑", "colour SWD ↓", "texture ↓",
                                "transformer alone: colour SWD ↓"],
                               ([name, measure_cells(res["rows"]["model"], VARIANT_MEASURES),
                                 f"{res['rows'].get(RAW_ROW, {}).get('colour_swd_to_style', float('nan')):.3f}"]
                                for name, res in r.variants.items()))
        text += "\n**Variants side by side** (the same held-out pairs):\n\n" + table + "\n"
    return text + "\n"


def evaluation_tables(pipe: StylePipeline, r: Report) -> str:
    """What was measured on the held-out triplets and the photographs, how, and the two tables."""
    return template("evaluation").format(n=r.n, size=pipe.config.tokenizer.image_size,
                                         device=r.timings.get("eval_device", "cpu"),
                                         synthetic=table_markdown(r.synthetic), photos=table_markdown(r.photos))


def selection_tables(r: Report) -> str:
    """How the sampling settings, the refinement and the palette step were chosen, each candidate's scores."""
    sampling_rows = "\n".join(f"| {k} | {v['ssim']:.4f} | {v['seed_spread']:.4f} |" for k, v in r.sampling["scores"].items())
    refine_rows = "\n".join(f"| {k} | {v['ssim']:.4f} | {v['edge_corr']:.4f} |"
                             for k, v in r.refinement.get("scores", {}).items())
    palette_rows = "\n".join(f"| {k} | {v.get('colour_swd_to_style', float('nan')):.4f} | "
                              f"{v['colour_dist_to_style']:.4f} | {v['ssim']:.4f} | {v['edge_corr']:.4f} |"
                              for k, v in r.palette.get("scores", {}).items())
    return template("selection").format(n=r.sampling.get("n", 0), min_spread=MIN_SEED_SPREAD, raw_row=RAW_ROW,
                                        target_edge_corr=r.palette.get("target_edge_corr", float("nan")),
                                        fixed=fixed_palette_text(r.palette), sampling_rows=sampling_rows,
                                        refine_rows=refine_rows, palette_rows=palette_rows)


def fixed_palette_text(selection: dict) -> str:
    """The card's sentence on a palette step the recipe fixed (`--palette`) instead of the rule above."""
    fixed = selection.get("fixed_by_recipe")
    return (f"The recipe ships **{fixed}** instead (`training.demo --palette`): the rule measures edges at the "
            "model's 64 px, where the guided upsampler has not yet put the content's detail back; at the returned "
            "size it keeps more of the content than the teacher's targets do (docs/training.md).\n" if fixed else "")
