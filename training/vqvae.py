"""Train the multi-scale VQ-VAE tokenizer: ``python -m training.vqvae``.

    python -m training.vqvae --data MANIFEST [--data ...] --preset tiny --out RUN --max-steps N \
        --batch-size B [--lr 2e-4] [--image-size S]
    torchrun --nproc_per_node G -m training.vqvae ...      # the same run on G processes

Loss = L1 + L2 reconstruction + the quantizer's VQ loss (codebook + commitment), plus LPIPS when its
weights are available (``--lpips-weight``; skipped with a log line otherwise). Codebook usage is logged
(``usage``: fraction of the codebook hit in the batch; ``active``: fraction hit within the last
``--dead-after`` steps). Dead-code restarts: every ``--restart-every`` steps, codebook entries not hit
for ``--dead-after`` steps are re-initialised from random encoder outputs of the current batch
(area-resized to the scales, as the quantizer sees them), on rank 0 and broadcast, and their AdamW
moments are reset.

The training images are every distinct image (content, style and target) of the manifests' train
split, centre-cropped to the tokenizer's size; validation uses the val split (reconstruction loss and
PSNR). ``RUN/final/`` holds ``tokenizer.safetensors`` + ``config.json`` (``{"tokenizer": {...}}``),
loadable with ``MultiScaleVQVAE.from_pretrained(RUN/final)`` and usable as
``training.sft --tokenizer RUN/final``.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from stylevar.config import VQVAEConfig
from stylevar.images import fit_square
from stylevar.tokenizer import MultiScaleVQVAE
from training.data import ROLES, TripletDataset, open_triplets, to_unit, try_load, warn_skip
from training.optim import ScheduleConfig, make_adamw, two_level_scheduler
from training.parts.checkpoints import CheckpointsUnreadableError
from training.parts.cli import FREE_KEYS, add_loop_args, loop_config, recipe_parser
from training.parts.distributed import (DistEnv, all_reduce_sum, broadcast_, setup_distributed, teardown_distributed,
                                        wrap_ddp)
from training.parts.log import MetricWindow
from training.parts.precision import autocast, make_grad_scaler, resolve_precision
from training.parts.rng import derived_generator, process_seed, seed_everything
from training.parts.run import TrainingRun
from training.parts.rundir import RunConfigMismatchError, RunDir
from training.parts.schedule import LoopConfig
from training.parts.skips import SkipTracker
from training.parts.state import TrainingState
from training.parts.step import log_objective_window, objective_step
from training.parts.streams import BatchStream, BatchStreamConfig, eval_loader, move_to
from training.presets import load_preset, resize_tokenizer



# ------------------------------------------------------------------------------------------ data
class ImageSet(Dataset):
    """Every distinct image of the given triplet datasets' entries, centre-cropped to S x S in [-1, 1].

    A missing or undecodable file is skipped (a warning names it): the next valid image is returned
    and the item's ``skipped`` list names the files passed over (as in ``training.data``).
    """

    def __init__(self, triplets: TripletDataset, image_size: int, max_skips: int = 100):
        seen: dict[str, None] = {}
        for entry in triplets.entries:
            for role in ROLES:
                if role in entry.paths:
                    seen.setdefault(entry.paths[role], None)
        self.paths = list(seen)
        self.image_size = image_size
        self.max_skips = max_skips
        self.skipped: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> dict[str, Any]:
        n = len(self.paths)
        passed: list[str] = []
        for k in range(min(self.max_skips, n)):
            path = self.paths[(index + k) % n]
            if path in self.skipped:
                passed.append(path)
                continue
            loaded = try_load(path)
            if not isinstance(loaded, str):
                return {"image": to_unit(fit_square(loaded, self.image_size, "crop")[0]), "skipped": passed}
            self.skipped[path] = loaded
            warn_skip(path, loaded)
            passed.append(path)
        raise RuntimeError(f"{len(passed)} consecutive unusable images from index {index}; check the data")


def collate_images(batch: list[dict]) -> dict[str, Any]:
    return {"image": torch.stack([b["image"] for b in batch]), "skipped": [p for b in batch for p in b["skipped"]]}


# ------------------------------------------------------------------------------------------ perceptual loss
def build_lpips(device: torch.device) -> tuple[nn.Module | None, str]:
    """The LPIPS network (VGG-16, differentiable, inputs in [-1, 1]) from the local weight cache, or
    (None, why not). Loading goes through ``stylevar.metrics.perceptual.LPIPSMetric``."""
    try:
        from stylevar import weights
        from stylevar.metrics.perceptual import LPIPSMetric

        path = weights.resolve("vgg16")
        metric = LPIPSMetric.from_weights("vgg", backbone=path)
    except ImportError as e:
        return None, f"LPIPS off: {e}"
    except (LookupError, FileNotFoundError, ValueError) as e:  # MissingWeightError, WeightMismatchError
        return None, f"LPIPS off: VGG-16 weights not usable ({type(e).__name__}: {str(e).splitlines()[0]})"
    return metric.model.requires_grad_(False).eval().to(device), f"LPIPS on (VGG-16 from {path})"


# ------------------------------------------------------------------------------------------ objective
@dataclass(frozen=True)
class LossWeights:
    l1: float = 1.0
    l2: float = 1.0
    vq: float = 1.0
    lpips: float = 0.0


class VQVAEObjective(nn.Module):
    """One micro-batch -> (loss, metrics); remembers the batch's codebook hits and last images."""

    def __init__(self, vqvae: MultiScaleVQVAE, weights: LossWeights, lpips_model: nn.Module | None = None):
        super().__init__()
        self.vqvae = vqvae
        self.weights = weights
        self.lpips = [lpips_model]  # a list: not a submodule (not trained, not checkpointed, not DDP-synced)
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


# ------------------------------------------------------------------------------------------ validation
@torch.no_grad()
def validate(vqvae: MultiScaleVQVAE, dataset: Dataset | None, env: DistEnv, batch_size: int,
             precision: str) -> dict[str, float]:
    if dataset is None:
        return {}
    was_training = vqvae.training
    vqvae.eval()
    sums = torch.zeros(4, dtype=torch.float64)  # l1 sum, l2 sum, psnr sum, images
    for batch in eval_loader(dataset, batch_size, env, collate_fn=collate_images):
        img = batch["image"].to(env.device)
        with autocast(precision, env.device):
            out = vqvae(img)
        recon = out.recon.float().clamp(-1, 1)
        mse_B = (recon - img).square().flatten(1).mean(1)
        sums += torch.tensor([
            float((recon - img).abs().flatten(1).mean(1).sum()),
            float(mse_B.sum()),
            float((10 * torch.log10(4.0 / mse_B.clamp_min(1e-10))).sum()),  # range [-1, 1]: peak^2 = 4
            img.shape[0],
        ], dtype=torch.float64)
    vqvae.train(was_training)
    total = all_reduce_sum(sums, env)
    n = max(float(total[3]), 1.0)
    return {"val_l1": float(total[0]) / n, "val_loss": float(total[1]) / n, "val_psnr": float(total[2]) / n,
            "val_images": int(total[3])}


# ------------------------------------------------------------------------------------------ CLI
def build_parser() -> argparse.ArgumentParser:
    p = recipe_parser("training.vqvae", __doc__,
                           data_help="triplet manifest (or folder holding manifest.jsonl); repeatable")
    p.add_argument("--preset", default="tiny", help="tiny|d16|d20|d24|d30 or a JSON preset file")
    p.add_argument("--image-size", type=int, default=None, help="train at this size (drops the finest scales)")
    p.add_argument("--init", default=None, metavar="DIR",
                   help="start from this tokenizer's weights (a model directory or RUN/final; same config)")
    p.add_argument("--l1-weight", type=float, default=1.0, help="weight of the L1 reconstruction loss")
    p.add_argument("--l2-weight", type=float, default=1.0, help="weight of the L2 reconstruction loss")
    p.add_argument("--vq-weight", type=float, default=1.0, help="weight of the codebook/commitment loss")
    p.add_argument("--lpips-weight", type=float, default=0.1, help="used when LPIPS weights are present")
    p.add_argument("--restart-every", type=int, default=50, help="dead-code check every N steps (0: never)")
    p.add_argument("--dead-after", type=int, default=100, help="a code unused this many steps is dead")
    p.add_argument("--val-batch-size", type=int, default=32, help="images per validation batch")
    add_loop_args(p, lr=2e-4, batch_size=32, max_grad_norm=1.0)
    return p


def check_inputs(args: argparse.Namespace) -> VQVAEConfig:
    """Fail fast (before any work) on missing inputs and impossible settings."""
    for d in args.data:
        path = Path(d)
        if not (path.is_file() or (path / "manifest.jsonl").is_file()):
            raise SystemExit(f"error: --data {d}: manifest not found")
    try:
        vq_cfg, _ = load_preset(args.preset)
        return resize_tokenizer(vq_cfg, args.image_size)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    vq_cfg = check_inputs(args)
    env = setup_distributed(args.device)
    try:
        return train(args, vq_cfg, env)
    except CheckpointsUnreadableError as e:
        raise SystemExit(f"error: {e}") from None
    finally:
        teardown_distributed()


def open_run(args: argparse.Namespace, vq_cfg: VQVAEConfig, env: DistEnv) -> RunDir:
    """RUN/, its config written or checked against the earlier run's."""
    config = {"recipe": "vqvae", **vars(args), "tokenizer": vq_cfg.to_dict()}
    try:
        return RunDir.prepare(args.out, config, env, free_keys=FREE_KEYS)
    except RunConfigMismatchError as e:
        raise SystemExit(f"error: {e}") from None


def open_images(args: argparse.Namespace, image_size: int) -> tuple[ImageSet, ImageSet | None]:
    """The images of the manifests' train split, and of their val split (None when there is none)."""
    train_triplets = open_triplets(args.data, "train", image_size, None, seed=args.seed)
    if not isinstance(train_triplets, TripletDataset):
        raise SystemExit("error: training.vqvae reads manifests (not shards)")
    train_set = ImageSet(train_triplets, image_size)
    try:
        val_set = ImageSet(open_triplets(args.data, "val", image_size, None), image_size)
    except ValueError:
        val_set = None  # no val split
    return train_set, val_set


def build_objective(args: argparse.Namespace, vq_cfg: VQVAEConfig, env: DistEnv) -> tuple[VQVAEObjective, str]:
    """A fresh tokenizer (seeded: the same on every rank) in its objective, and what the log says of LPIPS."""
    seed_everything(args.seed)
    vqvae = MultiScaleVQVAE(vq_cfg)
    if args.init:
        init_from(vqvae, Path(args.init))
    vqvae = vqvae.to(env.device).train()
    seed_everything(process_seed(args.seed, env.rank))  # the init above is the same on every rank
    lpips_model, lpips_note = (None, "LPIPS off (--lpips-weight 0)")
    if args.lpips_weight > 0:
        lpips_model, lpips_note = build_lpips(env.device)
    weights = LossWeights(args.l1_weight, args.l2_weight, args.vq_weight, args.lpips_weight if lpips_model else 0.0)
    return VQVAEObjective(vqvae, weights, lpips_model), lpips_note


def init_from(vqvae: MultiScaleVQVAE, folder: Path) -> None:
    """Copy a saved tokenizer's weights into `vqvae`; its config must be the run's."""
    try:
        src = MultiScaleVQVAE.from_pretrained(folder)
    except (FileNotFoundError, OSError, ValueError) as e:
        raise SystemExit(f"error: --init {folder}: {e}") from None
    if src.cfg.to_dict() != vqvae.cfg.to_dict():
        diff = {k: (v, vqvae.cfg.to_dict().get(k)) for k, v in src.cfg.to_dict().items() if vqvae.cfg.to_dict().get(k) != v}
        raise SystemExit(f"error: --init {folder}: its tokenizer config differs from the preset's (theirs, ours): {diff}")
    vqvae.load_state_dict(src.state_dict())


@dataclass
class VQVAERun:
    """What the step loop of one tokenizer run works with."""

    args: argparse.Namespace
    env: DistEnv
    precision: str
    model: nn.Module  # the objective, DDP-wrapped when distributed
    vqvae: MultiScaleVQVAE
    restarter: DeadCodeRestarter
    val_set: ImageSet | None
    skips: SkipTracker

    def to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        return move_to(self.skips.take(batch), self.env.device)

    def validation(self) -> dict[str, float]:
        return validate(self.vqvae, self.val_set, self.env, self.args.val_batch_size, self.precision)

    def steps(self, tr: TrainingRun, cfg: LoopConfig) -> int:
        """The steps from ``tr.start`` to ``cfg.max_steps`` (dead-code restarts, log lines, validations,
        checkpoints), then the final validation; returns the last step."""
        log, params = tr.log, list(self.vqvae.parameters())
        self.model.train()
        step = tr.start
        window = MetricWindow(self.env, last=("restarted_total", "active"))
        while step < cfg.max_steps:
            stats, lr = objective_step(tr, params, cfg, step + 1, self.to_device)
            step += 1
            stats.update(self.restarter(step, stats))
            window.add(stats)
            if cfg.log_due(step):
                log_objective_window(tr, cfg, step, window, lr, skipped_files=float(len(self.skips.all_paths())))
            if self.val_set is not None and cfg.val_due(step):
                log.log(step, self.validation(), prefix="val")
                self.model.train()
            if tr.checkpoint_due(step):
                tr.save(step, extra=self.restarter.state_dict())
        if self.val_set is not None and step > tr.start:
            log.log(step, self.validation(), prefix="val")
        return step

    def write_final(self, folder: Path) -> None:
        args = self.args
        self.vqvae.save_pretrained(folder, extra={"recipe": "vqvae", "steps": args.max_steps, "data": args.data})


def train(args: argparse.Namespace, vq_cfg: VQVAEConfig, env: DistEnv) -> int:
    precision = resolve_precision(args.precision, env.device)
    run = open_run(args, vq_cfg, env)
    train_set, val_set = open_images(args, vq_cfg.image_size)
    objective, lpips_note = build_objective(args, vq_cfg, env)
    vqvae = objective.vqvae
    # a Phi conv that no scale uses gets no gradient: DDP must then look for unused parameters
    used_phis = {id(vqvae.quantize.phi(k)) for k in range(len(vq_cfg.patch_nums))}
    model = wrap_ddp(objective, env, find_unused_parameters=len(used_phis) < vq_cfg.share_quant_resi)
    optimizer = make_adamw(vqvae, args.lr, args.weight_decay, betas=(0.9, 0.95))
    sched_cfg = ScheduleConfig(max_steps=args.max_steps, warmup_steps=args.warmup_steps, drop_step=args.max_steps)
    scheduler = two_level_scheduler(optimizer, sched_cfg)
    stream = BatchStream(train_set, BatchStreamConfig(global_batch=args.batch_size, grad_accum=args.grad_accum,
                                                      seed=args.seed, num_workers=args.num_workers,
                                                      collate_fn=collate_images), env)
    restarter = DeadCodeRestarter(objective, optimizer, env, every=args.restart_every,
                                  dead_after=args.dead_after, seed=args.seed)
    job = VQVAERun(args, env, precision, model, vqvae, restarter, val_set, SkipTracker(env))
    cfg = loop_config(args, precision)
    state = TrainingState(model, optimizer, scheduler, stream, env, scaler=make_grad_scaler(precision, env.device))
    with TrainingRun.for_loop(run, state, cfg) as tr:
        if tr.resumed.path is not None:
            restarter.load_state_dict(tr.resumed.extra)
        tr.log.info(f"{len(train_set)} training images, {len(val_set) if val_set else 0} validation images, "
                    f"{vq_cfg.image_size}px, patch_nums {vq_cfg.patch_nums}, world size {env.world_size}, {precision}")
        tr.log.info(lpips_note)
        step = job.steps(tr, cfg)
        tr.finish(step, job.write_final)
    job.skips.report(run, {**train_set.skipped, **(val_set.skipped if val_set else {})})
    return 0

if __name__ == "__main__":
    sys.exit(main())
