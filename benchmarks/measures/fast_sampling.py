"""The measurements of `python -m benchmarks.fast_sampling`: the full sampler and each fast-sampling plan on the
same inputs and seeds, their measures and their token agreement."""
from __future__ import annotations

import argparse
import dataclasses
import os

import torch

from stylevar.config import GenerationConfig
from stylevar.loaders.model_dir import DEMO_MODEL_DIR
from stylevar.pipelines.pipeline import StyleMix, StylePipeline
from stylevar.models.transformer.pruning import FastSampling
from stylevar.utils.threads import apply_threads
from training.parts import demo_export as demo

MEASURES = ("edge_corr", "colour_dist_to_style", "colour_swd_to_style", "texture_dist_to_style")


def rows_for(pipe: StylePipeline, triplets: list[demo.Triplet], seed: int, plans: dict[str, FastSampling]
             ) -> dict[str, dict[str, float]]:
    """The full sampler's row and one row per plan: mean measures, token agreement, seconds per image."""
    full = demo.generate(pipe, triplets, seed)
    sampled = Sampled.of(pipe, triplets, seed)
    rows = {"full sampler": {**demo.means(full), "sec_per_image": sum(full.seconds) / len(triplets)},
            "full sampler, seed + 1000": sampled.seed_agreement(pipe.model)}
    for name, plan in plans.items():
        pipe.model.fast_sampling = plan
        fast = demo.generate(pipe, triplets, seed, fast=True)
        rows[name] = {**demo.means(fast), "sec_per_image": sum(fast.seconds) / len(triplets),
                      **sampled.token_agreement(pipe.model, plan)}
    return rows


def merged_scales(plan: FastSampling, patch_nums) -> list[int]:
    """The scales that ``plan`` merges."""
    return [k for k, d in enumerate(plan.detail_groups(patch_nums)) if d is not None]


def agreement(a: list[torch.Tensor], b: list[torch.Tensor], pruned: list[int]) -> dict[str, float]:
    """Fraction of equal tokens of two samplings' token maps: all of them and those of the ``pruned`` scales."""
    same = [(x == y) for x, y in zip(a, b)]
    return {"agreement": float(torch.cat(same, 1).float().mean()),
            "agreement_pruned": float(torch.cat([same[k] for k in pruned], 1).float().mean())}


@dataclasses.dataclass
class Sampled:
    """The model's inputs for a set of triplets, the pipeline's settings with seed + i for triplet i, and the
    full sampler's token maps for them (sampled once, compared with every other sampling)."""

    content: torch.Tensor
    style: torch.Tensor
    settings: GenerationConfig
    full: list[torch.Tensor]

    @classmethod
    @torch.inference_mode()
    def of(cls, pipe: StylePipeline, triplets: list[demo.Triplet], seed: int) -> Sampled:
        contents = [t.content for t in triplets]
        content, _ = pipe.preprocess(contents)
        style = pipe.style_input(contents, [StyleMix.of(t.style) for t in triplets], "stretch")
        settings = dataclasses.replace(pipe.generation_config(), seed=[seed + i for i in range(len(triplets))])
        return cls(content, style, settings, pipe.model.generate_with_indices(content, style,
                                                                              **settings.kwargs()).indices)

    def sample(self, model, **changes) -> list[torch.Tensor]:
        return model.generate_with_indices(self.content, self.style,
                                           **dataclasses.replace(self.settings, **changes).kwargs()).indices

    @torch.inference_mode()
    def seed_agreement(self, model) -> dict[str, float]:
        """The full sampler's own token agreement between seeds seed + i and seed + 1000 + i: how much of the
        agreement below the sampler's randomness alone takes away."""
        other = self.sample(model, seed=[s + 1000 for s in self.settings.seed])
        return agreement(self.full, other, merged_scales(model.fast_sampling, model.cfg.patch_nums))

    @torch.inference_mode()
    def token_agreement(self, model, plan: FastSampling) -> dict[str, float]:
        """Fraction of fast sampling's tokens (``plan``) equal to the full sampler's (same inputs and seeds): all
        of them and those of the pruned scales; 1.0 for `coarse_identical` when every coarser scale's tokens
        are equal."""
        model.fast_sampling = plan
        fast = self.sample(model, fast=True)
        pruned = merged_scales(plan, model.cfg.patch_nums)
        coarse = all(torch.equal(a, b) for a, b in zip(self.full[:min(pruned)], fast[:min(pruned)]))
        return {**agreement(self.full, fast, pruned), "coarse_identical": float(coarse)}


def plan_name(plan: FastSampling) -> str:
    default = FastSampling()
    return f"fast, keep {plan.keep:g}" + ("" if plan.min_tokens == default.min_tokens else f", min {plan.min_tokens}")


def table_markdown(rows: dict[str, dict[str, float]]) -> str:
    cols = (*MEASURES, "agreement", "agreement_pruned", "sec_per_image")
    lines = ["| sampler | " + " | ".join(cols) + " | coarse = full |", "| --- |" + " --- |" * (len(cols) + 1)]
    for name, row in rows.items():
        coarse = {1.0: "yes", 0.0: "no"}.get(row.get("coarse_identical"), "-")
        lines.append(f"| {name} | " + " | ".join(f"{row[c]:.4f}" if c in row else "-" for c in cols)
                     + f" | {coarse} |")
    return "\n".join(lines)


def measure(a: argparse.Namespace) -> dict:
    """The rows of `python -m benchmarks.fast_sampling` (its options ``a``), with the run's settings and the load."""
    apply_threads(a.threads)
    model = str(DEMO_MODEL_DIR) if a.model is None else a.model
    pipe = StylePipeline.from_pretrained(model, device="cpu")
    min_tokens = FastSampling().min_tokens if a.min_tokens is None else a.min_tokens
    plans = [FastSampling(keep, min_tokens) for keep in a.keep] if a.keep else [pipe.model.fast_sampling]
    plans = {plan_name(plan): plan for plan in plans}
    size = pipe.image_size
    load = os.getloadavg()[0]
    out = {"model": model, "n": a.n, "seed": a.seed, "threads": a.threads, "load": load,
           "synthetic": rows_for(pipe, demo.heldout_triplets(a.n, size), a.seed, plans),
           "photos": rows_for(pipe, demo.photo_triplets(size), a.seed, plans),
           "load_after": os.getloadavg()[0]}
    return out
