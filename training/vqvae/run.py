"""A tokenizer run (``python -m training.vqvae``, whose options it takes): input checks, RUN/, the images of the
manifests (:class:`ImageSet`), the step loop and RUN/final (``tokenizer.safetensors`` + ``config.json``)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn
from torch.utils.data import Dataset

from stylevar.config import VQVAEConfig
from stylevar.processing.images import fit_square
from stylevar.models.tokenizer import MultiScaleVQVAE
from training.parts.data import ROLES, TripletDataset, check_data_args, open_triplets, to_unit, try_load, warn_skip
from training.parts.extension import RunExtension
from training.parts.optim import ScheduleConfig, make_adamw, two_level_scheduler
from training.parts.cli import FREE_KEYS, loop_config
from training.parts.distributed import DistEnv, all_reduce_sum, wrap_ddp
from training.parts.log import MetricWindow
from stylevar.utils.precision import autocast, make_grad_scaler, resolve_precision
from training.parts.run import TrainingRun, on_every_process
from training.parts.rundir import RunDir
from training.parts.schedule import LoopConfig
from training.parts.skips import SkipTracker
from training.parts.state import TrainingState
from training.parts.step import objective_steps
from training.parts.streams import BatchStream, BatchStreamConfig, eval_loader, loader_policy, move_to
from training.parts.presets import load_preset, resize_tokenizer
from training.vqvae.batch import resolve_batch
from training.vqvae.objective import DeadCodeRestarter, build_objective


class ImageSet(Dataset):
    """Every distinct image (of the given roles) of the triplet datasets' entries, centre-cropped to S x S in
    [-1, 1]; unusable files are skipped as in ``training.parts.data``."""

    def __init__(self, triplets: TripletDataset, image_size: int, max_skips: int = 100, roles: tuple[str, ...] = ROLES):
        seen: dict[str, None] = {}
        for entry in triplets.entries:
            for role in roles:
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


def check_inputs(args: argparse.Namespace) -> VQVAEConfig:
    """Fail fast (before any work) on missing inputs and impossible settings."""
    check_data_args(args.data)  # shards pass here; `open_images` refuses them
    try:
        vq_cfg, _ = load_preset(args.preset)
        return resize_tokenizer(vq_cfg, args.image_size)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def execute(args: argparse.Namespace) -> int:
    """``python -m training.vqvae`` once its options are parsed: the checks, then the run (on every process)."""
    vq_cfg = check_inputs(args)
    return on_every_process(args.device, lambda env: train(args, vq_cfg, env))


def schedule(options: Mapping[str, Any]) -> ScheduleConfig:
    """The learning rate: a linear warm-up, then constant (no drop), for ``vars(args)`` or a run's config."""
    return ScheduleConfig(max_steps=options["max_steps"], warmup_steps=options["warmup_steps"],
                          drop_step=options["max_steps"])


def open_run(args: argparse.Namespace, vq_cfg: VQVAEConfig, env: DistEnv) -> RunDir:
    """RUN/, its config written or checked against the earlier run's."""
    config = {"recipe": "vqvae", **vars(args), "tokenizer": vq_cfg.to_dict()}
    return RunDir.prepare(args.out, config, env, free_keys=FREE_KEYS, extension=RunExtension(schedule))


def open_images(args: argparse.Namespace, image_size: int) -> tuple[ImageSet, ImageSet | None]:
    """The images of the manifests' train split, and of their val split (None when there is none)."""
    train_triplets = open_triplets(args.data, "train", image_size, None, seed=args.seed)
    if not isinstance(train_triplets, TripletDataset):
        raise SystemExit("error: training.vqvae reads manifests (not shards)")
    roles = tuple(args.roles.split(","))
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise SystemExit(f"error: --roles: {unknown} not among {', '.join(ROLES)}")
    train_set = ImageSet(train_triplets, image_size, roles=roles)
    try:
        val_set = ImageSet(open_triplets(args.data, "val", image_size, None), image_size, roles=roles)
    except ValueError:
        val_set = None  # no val split
    return train_set, val_set


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
        batch = move_to(self.skips.take(batch), self.env.device)
        if self.args.channels_last:
            batch["image"] = batch["image"].contiguous(memory_format=torch.channels_last)
        return batch

    def validation(self) -> dict[str, float]:
        return validate(self.vqvae, self.val_set, self.env, self.args.val_batch_size, self.precision)

    def steps(self, tr: TrainingRun, cfg: LoopConfig) -> int:
        validation = self.validation if self.val_set is not None else None
        return objective_steps(tr, cfg, list(self.vqvae.parameters()), self.model, self.to_device,
                               MetricWindow(self.env, last=("restarted_total", "active")),
                               lambda: len(self.skips.all_paths()), validation=validation,
                               checkpoint_extra=self.restarter.state_dict, more_stats=self.restarter)

    def write_final(self, folder: Path) -> None:
        args = self.args
        self.vqvae.save_pretrained(folder, extra={"recipe": "vqvae", "steps": args.max_steps, "data": args.data})


def train(args: argparse.Namespace, vq_cfg: VQVAEConfig, env: DistEnv) -> int:
    precision = resolve_precision(args.precision, env.device)
    batch_note = ""
    if args.batch_size == "auto":
        args.batch_size, batch_note = resolve_batch(args, vq_cfg, env)
    run = open_run(args, vq_cfg, env)
    train_set, val_set = open_images(args, vq_cfg.image_size)
    objective, lpips_note = build_objective(args, vq_cfg, env)
    vqvae = objective.vqvae
    # a Phi conv that no scale uses gets no gradient: DDP must then look for unused parameters
    used_phis = {id(vqvae.quantize.phi(k)) for k in range(len(vq_cfg.patch_nums))}
    model = wrap_ddp(objective, env, find_unused_parameters=len(used_phis) < vq_cfg.share_quant_resi)
    optimizer = make_adamw(vqvae, args.lr, args.weight_decay, betas=(0.9, 0.95))
    scheduler = two_level_scheduler(optimizer, schedule(vars(args)))
    stream = BatchStream(train_set, BatchStreamConfig(global_batch=args.batch_size, grad_accum=args.grad_accum,
                                                      seed=args.seed, loader=loader_policy(args.num_workers, env.device),
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
        if batch_note:
            tr.log.info(batch_note)
        step = job.steps(tr, cfg)
        tr.finish(step, job.write_final)
    job.skips.report(run, {**train_set.skipped, **(val_set.skipped if val_set else {})})
    return 0
