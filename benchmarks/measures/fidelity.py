"""The experiments of `python -m benchmarks.fidelity` (its docstring says what each command measures): the
ceilings, the variant runs and their scores, the training-length curve, and their tables."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from stylevar.config import StyleVARConfig, VQVAEConfig
from stylevar.metrics.structure import edge_correlation, ssim_standard
from stylevar.pipelines.pipeline import StylePipeline
from training.parts import demo_export as demo
from training.parts.demo_card import ARROWS
from stylevar.models.transformer import StyleVAR
from stylevar.utils.threads import apply_threads
from training.parts.checkpoints import checkpoint_paths, read_checkpoint
from training.parts.presets import match_transformer
from training.parts.sft_model import read_tokenizer


DEFAULT_VARIANTS = {"published": {}, "injection": {"content_injection": True}}


def load_tokenizer(folder: Path):
    """A tokenizer folder (training.vqvae RUN/final) or a model directory."""
    return read_tokenizer(str(folder), VQVAEConfig.preset("tiny"), None).eval()


@torch.no_grad()
def ceiling(tokenizer_dir: Path, n: int, seed: int = demo.HELDOUT_SEED) -> dict[str, float]:
    tok = load_tokenizer(tokenizer_dir)
    size = tok.cfg.image_size
    triplets = demo.heldout_triplets(n, size, seed)
    content, target = (demo.image_batch([getattr(t, k) for t in triplets], size) for k in ("content", "target"))

    def recon(x: torch.Tensor) -> torch.Tensor:
        return tok.decode_indices(tok.encode_indices(x * 2 - 1)).add(1).mul(0.5).clamp(0, 1)

    def autoencode(x: torch.Tensor) -> torch.Tensor:  # no quantisation: the encoder/decoder alone
        return tok.decode_fhat(tok.latent(x * 2 - 1)).add(1).mul(0.5).clamp(0, 1)

    rc, rt, ac = recon(content), recon(target), autoencode(content)
    return {
        "n": n, "image_size": size, "latent": tok.latent_size, "scales": list(tok.cfg.patch_nums),
        "target_vs_content_edge_corr": float(edge_correlation(target, content).mean()),
        "recon_content_edge_corr": float(edge_correlation(rc, content).mean()),
        "autoencoder_content_edge_corr": float(edge_correlation(ac, content).mean()),
        "recon_target_vs_content_edge_corr": float(edge_correlation(rt, content).mean()),
        "recon_target_ssim_standard": float(ssim_standard(rt, target).mean()),
        "recon_content_ssim_standard": float(ssim_standard(rc, content).mean()),
    }


# ------------------------------------------------------------------------------------------ compare
def parse_variants(items: list[str] | None) -> dict[str, dict]:
    if not items:
        return dict(DEFAULT_VARIANTS)
    out = {}
    for item in items:
        name, _, spec = item.partition("=")
        if not name.isidentifier():
            raise SystemExit(f"--variant {item!r}: the name must be a plain word")
        try:
            out[name] = json.loads(spec) if spec else DEFAULT_VARIANTS.get(name, {})
        except json.JSONDecodeError as e:
            raise SystemExit(f"--variant {item!r}: not JSON: {e}") from None
    return out


def variant_preset(tokenizer_dir: Path, overrides: dict, path: Path) -> Path:
    """A preset file: the tokenizer's config and the tiny transformer, fitted to it, with `overrides`."""
    vq = load_tokenizer(tokenizer_dir).cfg
    tr = dataclasses.replace(match_transformer(StyleVARConfig.preset("tiny"), vq), **overrides)
    path.write_text(json.dumps({"tokenizer": vq.to_dict(), "transformer": tr.to_dict()}, indent=1))
    return path


def train_variant(args: argparse.Namespace, name: str, overrides: dict) -> dict:
    run = args.out / name
    run.mkdir(parents=True, exist_ok=True)
    final = run / "final" / "transformer.safetensors"
    if final.is_file():
        return json.loads((run / "timing.json").read_text()) if (run / "timing.json").is_file() else {}
    preset = variant_preset(args.tokenizer, overrides, run / "preset.json")
    cmd = [sys.executable, "-m", "training.sft", "--data", str(args.data), "--preset", str(preset),
           "--tokenizer", str(args.tokenizer), "--out", str(run), "--max-steps", str(args.steps),
           "--batch-size", str(args.batch_size), "--lr", "5e-4", "--warmup-steps", "50", "--save-every", "100",
           "--val-every", str(args.steps), "--val-max-batches", "2", "--seed", str(args.seed), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    t0 = time.perf_counter()
    with open(run / "train.log", "a") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    timing = {"steps": args.steps, "threads": args.threads, "train_minutes": (time.perf_counter() - t0) / 60}
    (run / "timing.json").write_text(json.dumps(timing))
    return timing


def compare(args: argparse.Namespace) -> dict:
    variants = parse_variants(args.variant)
    samplings = [parse_sampling(x) for x in (args.sampling or ["20,0.8", "1,0"])]
    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        timings = dict(zip(variants, pool.map(lambda kv: train_variant(args, *kv), variants.items())))
    apply_threads(args.threads * args.jobs)
    results: dict = {"steps": args.steps, "n": args.n, "rows": {}}
    suite = demo.make_suite()
    held = photos = None
    for name, overrides in variants.items():
        pipe = StylePipeline.from_pretrained(args.out / name / "final", device="cpu")
        size = pipe.image_size
        if held is None:  # every variant shares the tokenizer, hence the size: pairs and baselines once
            held, photos = demo.heldout_triplets(args.n, size), demo.photo_triplets(size)
            results["baselines"] = {m: {"synthetic": s, "photos": p} for (m, s), p in zip(
                demo.score_baselines(held, size, suite).items(), demo.score_baselines(photos, size).values())}
        for sampling in samplings:
            pipe.config.generation = dict(sampling)
            label = f"{name} {json.dumps(overrides)}, top-k {sampling['top_k']}, top-p {sampling['top_p']}"
            results["rows"][label] = {"variant": name, "overrides": overrides, "sampling": sampling, **timings[name],
                                      "synthetic": demo.evaluate_model(pipe, held, suite=suite),
                                      "photos": demo.evaluate_model(pipe, photos)}
        pipe.config.generation = dict(samplings[0])
        demo.sample_grid(pipe, held[:6] + photos, args.out / f"grid_{name}.png")
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    (args.out / "table.md").write_text(table_markdown(results) + "\n")
    return results


def parse_sampling(text: str) -> dict:
    try:
        k, p = text.split(",")
        return {"top_k": int(k), "top_p": float(p)}
    except ValueError:
        raise SystemExit(f"--sampling {text!r}: expected TOP_K,TOP_P such as 20,0.8") from None


# ------------------------------------------------------------------------------------------ curve
CURVE_SAMPLING = {"top_k": 5, "top_p": 0.7}
CURVE_COLUMNS = (("synthetic", "edge_corr"), ("synthetic", "colour_dist_to_style"), ("synthetic", "colour_swd_to_style"),
                 ("synthetic", "texture_dist_to_style"), ("synthetic", "ssim"), ("photos", "edge_corr"),
                 ("photos", "colour_dist_to_style"))


def checkpoint_pipeline(run: Path, path: Path) -> StylePipeline:
    """The transformer of an SFT checkpoint in `run` (its preset and tokenizer from RUN/config.json)."""
    settings = json.loads((run / "config.json").read_text())
    tokenizer = load_tokenizer(Path(settings["tokenizer"]))
    preset = json.loads(Path(settings["preset"]).read_text())["transformer"]
    model = StyleVAR(match_transformer(StyleVARConfig.from_dict(preset), tokenizer.cfg), tokenizer)
    state = read_checkpoint(path)["model"]
    model.load_transformer_state_dict({k.removeprefix("model."): v for k, v in state.items()
                                       if not k.startswith("model.tokenizer.")})
    return StylePipeline.from_models(model.eval(), generation=dict(CURVE_SAMPLING))


def curve(run: Path, steps: list[int] | None, n: int) -> dict:
    found = dict(checkpoint_paths(run / "checkpoints"))
    chosen = sorted(found) if not steps else steps
    missing = [s for s in chosen if s not in found]
    if missing:
        raise SystemExit(f"no checkpoint for steps {missing} in {run / 'checkpoints'} (kept: {sorted(found)})")
    rows: dict = {}
    held = photos = None
    for step in chosen:
        pipe = checkpoint_pipeline(run, found[step])
        if held is None:
            held, photos = demo.heldout_triplets(n, pipe.image_size), demo.photo_triplets(pipe.image_size)
        rows[str(step)] = {"synthetic": demo.means(demo.generate(pipe, held)),
                           "photos": demo.means(demo.generate(pipe, photos))}
    return {"run": str(run), "n": n, "sampling": CURVE_SAMPLING, "rows": rows}


def curve_markdown(result: dict) -> str:
    head = "| step | " + " | ".join(f"{where} {m} {ARROWS[m]}".strip() for where, m in CURVE_COLUMNS) + " |"
    lines = [head, "| --- |" + " --- |" * len(CURVE_COLUMNS)]
    for step, r in result["rows"].items():
        lines.append(f"| {step} | " + " | ".join(f"{r[w][m]:.3f}" for w, m in CURVE_COLUMNS) + " |")
    return "\n".join(lines)


COLUMNS = (("synthetic", "edge_corr"), ("synthetic", "ssim_standard"), ("synthetic", "ssim"), ("synthetic", "l1"),
           ("synthetic", "colour_dist_to_style"), ("synthetic", "colour_swd_to_style"),
           ("synthetic", "texture_dist_to_style"), ("synthetic", "seed_spread"), ("photos", "edge_corr"),
           ("photos", "colour_dist_to_style"))


def table_markdown(results: dict) -> str:
    head = "| method | " + " | ".join(f"{where} {m} {ARROWS[m]}".strip() for where, m in COLUMNS)
    lines = [head + " | train min |", "| --- |" + " --- |" * (len(COLUMNS) + 1)]
    rows = [(label, v, f"{v.get('train_minutes', float('nan')):.1f}") for label, v in results["rows"].items()]
    rows += [(name, b, "-") for name, b in results.get("baselines", {}).items()]
    for label, r, minutes in rows:
        cells = [f"{r[w][m]:.3f}" if m in r[w] else "-" for w, m in COLUMNS]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {minutes} |")
    return "\n".join(lines)
