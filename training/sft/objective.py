"""What SFT optimises and measures (``python -m training.sft``): the teacher-forced, label-smoothed
cross-entropy of one micro-batch (:class:`SFTObjective`, with the alpha jitter and PANW's per-scale token
weights) and the validation's plain CE and accuracy, per scale too (:func:`validate`)."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, IterableDataset

from stylevar.models.transformer import Condition, StyleVAR
from training.parts.data import collate_triplets
from training.parts.distributed import DistEnv, all_reduce_sum
from stylevar.utils.precision import autocast
from training.parts.rng import derived_generator
from training.parts.scale_weights import panw_weights
from training.parts.streams import eval_loader
from training.parts.token_inputs import condition_from_tokens, encode_triplets, tokens_from_indices


def jittered_alphas(base_K: torch.Tensor, jitter: float, g: torch.Generator) -> torch.Tensor:
    """alpha_k + U(-jitter, jitter), clamped to [0.01, 0.99] (on the CPU, as ``base_K`` and ``g``)."""
    u = torch.rand(base_K.shape, generator=g, dtype=torch.float32) * 2 - 1
    return (base_K + jitter * u).clamp(0.01, 0.99)


class SFTObjective(nn.Module):
    """One micro-batch of triplets -> (label-smoothed CE, metrics). Token maps come from the batch's
    ``tokens_B3L`` (token cache), else from one fused encode, else (``fuse_encodes=False``) three: the same maps."""

    def __init__(self, model: StyleVAR, *, label_smoothing: float, alpha_jitter: float, seed: int,
                 fuse_encodes: bool = True, scale_gamma: float = 0.0):
        super().__init__()
        self.model = model
        self.label_smoothing, self.alpha_jitter, self.seed = label_smoothing, alpha_jitter, seed
        # gamma 0: the plain mean over tokens (the reference's loss); > 0: coarse scales weigh more (PANW)
        self.weights_L = panw_weights(model.cfg.patch_nums, scale_gamma) if scale_gamma > 0 else None
        self.fuse_encodes = fuse_encodes
        self.draws = 0  # micro-batches seen: keys the alpha jitter (checkpointed)

    def inputs(self, batch: dict[str, Any]) -> tuple[list[torch.Tensor], Condition | None]:
        """The target's K token maps and the condition (None: `teacher_forcing_logits` makes it)."""
        content, style, tokenizer = batch["content"], batch["style"], self.model.tokenizer
        if "tokens_B3L" in batch:
            tokens = tokens_from_indices(tokenizer, batch["tokens_B3L"])
        elif self.fuse_encodes:
            tokens = encode_triplets(tokenizer, batch["target"], style, content)[0]
        else:
            with torch.no_grad(), torch.autocast(content.device.type, enabled=False):
                return tokenizer.encode_indices(batch["target"]), None
        return tokens.target, condition_from_tokens(self.model, content, style, tokens)

    def forward(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        content, style = batch["content"], batch["style"]
        target_idx, cond = self.inputs(batch)
        alphas = None
        if self.alpha_jitter > 0:
            g = derived_generator(self.seed, self.draws, 0xA1FA)
            base_K = torch.tensor(self.model.cfg.alpha_nums, dtype=torch.float32)  # the host's: no device read
            alphas = jittered_alphas(base_K, self.alpha_jitter, g).to(content.device, non_blocking=True)
        self.draws += 1
        logits_BLV = self.model.teacher_forcing_logits(content, style, target_idx, alphas=alphas, cond=cond)
        gt_BL = torch.cat(target_idx, dim=1)
        flat = logits_BLV.reshape(-1, logits_BLV.shape[-1])
        if self.weights_L is None:
            loss = F.cross_entropy(flat, gt_BL.reshape(-1), label_smoothing=self.label_smoothing)
        else:
            ce_BL = F.cross_entropy(flat, gt_BL.reshape(-1), label_smoothing=self.label_smoothing,
                                    reduction="none").view_as(gt_BL)
            loss = (ce_BL * self.weights_L.to(ce_BL.device)).sum(1).mean()
        with torch.no_grad():
            plain = self.label_smoothing or self.weights_L is not None
            ce = F.cross_entropy(flat, gt_BL.reshape(-1)) if plain else loss.detach()
            acc = (logits_BLV.argmax(-1) == gt_BL).float().mean()
        return loss, {"ce": ce.detach(), "acc": acc}


@torch.no_grad()
def validate(model: StyleVAR, dataset: Dataset | None, env: DistEnv, batch_size: int, precision: str,
             max_batches: int = 0) -> dict[str, float]:
    """Plain CE and top-1 accuracy over the val split (all ranks; sums reduced), per scale too."""
    if dataset is None:
        return {}
    was_training = model.training
    model.eval()
    patch_nums = model.cfg.patch_nums
    K = len(patch_nums)
    sums = torch.zeros(2 + K, dtype=torch.float64)  # CE sum, token count, correct per scale
    counts_K = torch.tensor([pn * pn for pn in patch_nums], dtype=torch.float64)
    if isinstance(dataset, IterableDataset):
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, collate_fn=collate_triplets)
    else:
        loader = eval_loader(dataset, batch_size, env, collate_fn=collate_triplets)
    images = 0
    for b, batch in enumerate(loader):
        if max_batches and b >= max_batches:
            break
        content, style, target = (batch[k].to(env.device) for k in ("content", "style", "target"))
        target_idx = model.tokenizer.encode_indices(target)
        with autocast(precision, env.device):
            logits_BLV = model.teacher_forcing_logits(content, style, target_idx)
        gt_BL = torch.cat(target_idx, dim=1)
        ce = F.cross_entropy(logits_BLV.float().reshape(-1, logits_BLV.shape[-1]), gt_BL.reshape(-1), reduction="sum")
        correct_BL = (logits_BLV.argmax(-1) == gt_BL).double()
        per_scale = torch.stack([c.sum() for c in correct_BL.split([pn * pn for pn in patch_nums], dim=1)])
        sums += torch.cat([torch.stack([ce.double().cpu(), torch.tensor(float(gt_BL.numel()), dtype=torch.float64)]),
                           per_scale.cpu()])
        images += content.shape[0]
    model.train(was_training)
    total = all_reduce_sum(sums, env)
    n_img = float(all_reduce_sum(torch.tensor([float(images)]), env)[0])
    tokens = max(float(total[1]), 1.0)
    out = {"val_loss": float(total[0]) / tokens, "val_acc": float(total[2:].sum()) / tokens, "val_images": int(n_img)}
    for k in range(K):
        out[f"val_acc_s{k}"] = float(total[2 + k]) / max(n_img * float(counts_K[k]), 1.0)
    return out
