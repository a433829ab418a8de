"""What a tokenizer run optimises (:class:`VQVAEObjective`: reconstruction, VQ, LPIPS and, when weighted, the
stroke losses) and the dead-code restarts (:class:`DeadCodeRestarter`)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stylevar.config import VQVAEConfig
from stylevar.models.tokenizer import MultiScaleVQVAE
from stylevar.models.tokenizer.autoencoder import widen_to_space_to_channel
from training.parts.distributed import DistEnv, all_reduce_sum, broadcast_
from training.parts.rng import derived_generator, process_seed, seed_everything


def build_lpips(device: torch.device) -> tuple[nn.Module | None, str]:
    """The LPIPS network from the local weight cache, or (None, why not)."""
    try:
        from stylevar.loaders import weights
        from stylevar.metrics.perceptual import LPIPSMetric

        path = weights.resolve("vgg16")
        metric = LPIPSMetric.from_weights("vgg", backbone=path)
    except ImportError as e:
        return None, f"LPIPS off: {e}"
    except (LookupError, FileNotFoundError, ValueError) as e:  # MissingWeightError, WeightMismatchError
        return None, f"LPIPS off: VGG-16 weights not usable ({type(e).__name__}: {str(e).splitlines()[0]})"
    return metric.model.requires_grad_(False).eval().to(device), f"LPIPS on (VGG-16 from {path})"


def build_style_features(device: torch.device) -> nn.Module:
    """The teacher's style predictor (`stylevar.metrics.pretrained_style`), fixed; a clear exit without the extra."""
    from stylevar.loaders.teacher import TeacherUnavailable
    from stylevar.metrics.pretrained_style import StylePredictor
    try:
        return StylePredictor().eval().to(device)
    except TeacherUnavailable as e:
        raise SystemExit(f"error: --style-feature-weight: {e}") from None


def feature_distance(feats_a: list[torch.Tensor], feats_b: list[torch.Tensor]) -> torch.Tensor:
    """Mean over layers of ||a - b||^2 / ||b||^2 (each layer's share independent of its scale)."""
    return torch.stack([(a - b).pow(2).mean() / b.pow(2).mean().clamp_min(1e-8)
                        for a, b in zip(feats_a, feats_b)]).mean()


def gradient_l1(a_B3HW: torch.Tensor, b_B3HW: torch.Tensor) -> torch.Tensor:
    """L1 distance of the horizontal and vertical pixel differences."""
    dx = (a_B3HW.diff(dim=3) - b_B3HW.diff(dim=3)).abs().mean()
    dy = (a_B3HW.diff(dim=2) - b_B3HW.diff(dim=2)).abs().mean()
    return dx + dy


@dataclass(frozen=True)
class LossWeights:
    l1: float = 1.0
    l2: float = 1.0
    vq: float = 1.0
    lpips: float = 0.0
    style_features: float = 0.0
    gradient: float = 0.0


class VQVAEObjective(nn.Module):
    """One micro-batch -> (loss, metrics); remembers the batch's codebook hits and last images."""

    def __init__(self, vqvae: MultiScaleVQVAE, weights: LossWeights, lpips_model: nn.Module | None = None,
                 style_model: nn.Module | None = None):
        super().__init__()
        self.vqvae = vqvae
        self.weights = weights
        self.lpips = [lpips_model]  # a list: not a submodule (not trained, not checkpointed, not DDP-synced)
        self.style = [style_model]
        self.hits_V = torch.zeros(vqvae.cfg.vocab_size, dtype=torch.float64)
        self.last_images: torch.Tensor | None = None

    def forward(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        img = batch["image"]
        out = self.vqvae(img)
        l1 = (out.recon - img).abs().mean()
        l2 = F.mse_loss(out.recon, img)
        loss = self.weights.l1 * l1 + self.weights.l2 * l2 + self.weights.vq * out.vq_loss
        metrics = {"l1": l1.detach(), "l2": l2.detach(), "vq_loss": out.vq_loss.detach(), "usage": out.usage.detach()}
        if self.lpips[0] is not None and self.weights.lpips > 0:
            p = self.lpips[0](out.recon.float(), img.float()).mean()
            loss = loss + self.weights.lpips * p
            metrics["lpips"] = p.detach()
        if self.weights.gradient > 0:
            g = gradient_l1(out.recon, img)
            loss = loss + self.weights.gradient * g
            metrics["gradient"] = g.detach()
        if self.style[0] is not None and self.weights.style_features > 0:
            unit = [x.float().add(1).mul(0.5) for x in (out.recon, img)]  # the predictor takes [0, 1]
            with torch.no_grad():
                target_feats = self.style[0].features(unit[1])
            f = feature_distance(self.style[0].features(unit[0]), target_feats)
            loss = loss + self.weights.style_features * f
            metrics["style_features"] = f.detach()
        with torch.no_grad():
            if self.hits_V.device != img.device:
                self.hits_V = self.hits_V.to(img.device)
            for idx in out.indices:
                self.hits_V += torch.bincount(idx.flatten(), minlength=self.hits_V.numel()).to(self.hits_V)
            self.last_images = img.detach()
        return loss, metrics


class DeadCodeRestarter:
    """Tracks steps since each code was last hit (over all ranks) and re-seeds the dead ones."""

    def __init__(self, objective: VQVAEObjective, optimizer: torch.optim.Optimizer, env: DistEnv, *,
                 every: int, dead_after: int, seed: int):
        self.obj, self.opt, self.env = objective, optimizer, env
        self.every, self.dead_after, self.seed = every, dead_after, seed
        self.since_hit_V = torch.zeros(objective.vqvae.cfg.vocab_size, dtype=torch.long)
        self.restarted_total = 0

    def state_dict(self) -> dict[str, Any]:
        return {"since_hit_V": self.since_hit_V.clone(), "restarted_total": self.restarted_total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "since_hit_V" in state:
            self.since_hit_V = state["since_hit_V"].clone()
            self.restarted_total = int(state["restarted_total"])

    @torch.no_grad()
    def __call__(self, step: int, stats: dict[str, Any]) -> dict[str, float]:
        hits = all_reduce_sum(self.obj.hits_V, self.env)
        self.obj.hits_V.zero_()
        self.since_hit_V = torch.where(hits > 0, torch.zeros_like(self.since_hit_V), self.since_hit_V + 1)
        out = {"active": float((self.since_hit_V < self.dead_after).float().mean()),
               "restarted_total": float(self.restarted_total)}
        if self.every <= 0 or step % self.every != 0:
            return out
        dead = torch.nonzero(self.since_hit_V >= self.dead_after).flatten()
        if dead.numel() == 0:
            return out
        vqvae = self.obj.vqvae
        emb = vqvae.quantize.embedding.weight
        if self.env.is_main:
            assert self.obj.last_images is not None
            was_training = vqvae.training
            vqvae.eval()
            f_BCnn = vqvae.latent(self.obj.last_images).float()
            vqvae.train(was_training)
            pool = torch.cat(
                [F.interpolate(f_BCnn, size=(pn, pn), mode="area").permute(0, 2, 3, 1).reshape(-1, f_BCnn.shape[1])
                 for pn in vqvae.cfg.patch_nums]
            ).cpu()
            g = derived_generator(self.seed, step, 0xDEAD)
            pick = torch.randint(0, pool.shape[0], (dead.numel(),), generator=g)
            noise = 0.01 * pool.std() * torch.randn(dead.numel(), pool.shape[1], generator=g)
            new = emb.detach().clone()
            new[dead.to(new.device)] = (pool[pick] + noise).to(new)
        else:
            new = torch.empty_like(emb)
        broadcast_(new, self.env)
        emb.copy_(new)
        state = self.opt.state.get(emb, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                state[key][dead.to(state[key].device)] = 0
        self.since_hit_V[dead] = 0
        self.restarted_total += int(dead.numel())
        out["restarted_total"] = float(self.restarted_total)
        return out


def build_objective(args: argparse.Namespace, vq_cfg: VQVAEConfig, env: DistEnv) -> tuple[VQVAEObjective, str]:
    """A fresh tokenizer (seeded alike on every rank) in its objective, and log lines about it."""
    seed_everything(args.seed)
    vqvae = MultiScaleVQVAE(vq_cfg)
    init_note = init_from(vqvae, Path(args.init)) if args.init else ""
    vqvae = vqvae.to(env.device).train()
    if args.channels_last:
        vqvae.to(memory_format=torch.channels_last)
    seed_everything(process_seed(args.seed, env.rank))  # the init above is the same on every rank
    lpips_model, lpips_note = (None, "LPIPS off (--lpips-weight 0)")
    if args.lpips_weight > 0:
        lpips_model, lpips_note = build_lpips(env.device)
    weights = LossWeights(args.l1_weight, args.l2_weight, args.vq_weight, args.lpips_weight if lpips_model else 0.0,
                          args.style_feature_weight, args.gradient_weight)
    style_model = build_style_features(env.device) if args.style_feature_weight > 0 else None
    return (VQVAEObjective(vqvae, weights, lpips_model, style_model),
            "; ".join(n for n in (init_note, lpips_note) if n))


def init_from(vqvae: MultiScaleVQVAE, folder: Path) -> str:
    """Copy a saved tokenizer's weights into `vqvae`; its config must be the run's, or the same at space-to-channel
    1 (widened: `widen_to_space_to_channel`). What was done, for the log."""
    try:
        src = MultiScaleVQVAE.from_pretrained(folder)
    except (FileNotFoundError, OSError, ValueError) as e:
        raise SystemExit(f"error: --init {folder}: {e}") from None
    ours, theirs = vqvae.cfg.to_dict(), src.cfg.to_dict()
    s = vqvae.cfg.space_to_channel
    if theirs == ours:
        vqvae.load_state_dict(src.state_dict())
        return f"initialised from {folder}"
    if s > 1 and theirs == {**ours, "space_to_channel": 1}:
        vqvae.load_state_dict(widen_to_space_to_channel(src.state_dict(), s))
        return f"initialised from {folder}, widened to space-to-channel {s} (its twin at {src.cfg.image_size} px)"
    diff = {k: (v, ours.get(k)) for k, v in theirs.items() if ours.get(k) != v}
    raise SystemExit(f"error: --init {folder}: its tokenizer config differs from the preset's (theirs, ours): {diff}")
