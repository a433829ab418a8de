"""Checkpoint I/O: the published reference layouts in, checked against the model built from a config.

Reference StyleVAR checkpoints store full (3C, C) qkv matrices for both the guide and the target
projections; only the guide's Q rows and the target's K/V rows are ever used, so they load into
`q_guide` and `kv_target` and the rest is dropped. Derived buffers are recomputed, never trusted.
Files are read, and checked against the model, by `stylevar.state_dict`; the project's own format
(safetensors files, a config.json section per model) is `stylevar.pretrained`'s.
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping

from stylevar.config import StyleVARConfig, VQVAEConfig
from stylevar.state_dict import (CheckpointError, StateDict, WeightMismatchError, check_state_dict, is_state_dict,
                                 read_file, read_state_dict)
from stylevar.tokenizer import MultiScaleVQVAE
from stylevar.transformer import StyleVAR

_DERIVED = re.compile(r"(^|\.)(lvl_1L|attn_bias_for_masking|zero_k_bias\w*|num_batches_tracked)$")
_ATTN_REF = re.compile(r"^blocks\.(\d+)\.attn\.(mat_qkv_guide\.weight|mat_qkv_target\.weight|q_bias_guide|"
                       r"v_bias_guide|q_bias_target|v_bias_target)$")


# ---- reading ---------------------------------------------------------------------------------------
def read_state(path_or_sd: str | os.PathLike | Mapping[str, Any]) -> tuple[StateDict, dict]:
    """A state dict (and the checkpoint's `args`, if any) from a file or an in-memory checkpoint.

    Accepts a plain state dict, `{"model": sd}` and `{"trainer": {"var_wo_ddp": sd}}`; files are read by
    `stylevar.state_dict.read_file` (`weights_only=True`; `.safetensors` with safetensors).
    """
    obj: Any = path_or_sd if isinstance(path_or_sd, Mapping) else read_file(path_or_sd, what="checkpoint")
    args = {}
    if isinstance(obj, Mapping) and isinstance(obj.get("args"), Mapping):
        args = dict(obj["args"])
    if isinstance(obj, Mapping) and isinstance(obj.get("trainer"), Mapping) and "var_wo_ddp" in obj["trainer"]:
        obj = obj["trainer"]["var_wo_ddp"]
    elif isinstance(obj, Mapping) and isinstance(obj.get("model"), Mapping):
        obj = obj["model"]
    if not is_state_dict(obj):
        raise CheckpointError("checkpoint holds no state dict (expected a dict of tensors, {'model': ...} "
                              "or {'trainer': {'var_wo_ddp': ...}})")
    sd = {k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in obj.items()}
    return sd, args


def bake_lora(sd: StateDict, args: Mapping[str, Any] | None = None, scaling: float | None = None) -> StateDict:
    """Replace LoRA-wrapped linears (`X.base_weight`, `X.lora_A`, `X.lora_B`) by W = base + (B @ A) * scaling."""
    lora_names = sorted({k[: -len(".lora_A")] for k in sd if k.endswith(".lora_A")})
    if not lora_names:
        return sd
    if scaling is None:
        args = args or {}
        if "lora_rank" not in args or "lora_alpha" not in args:
            raise CheckpointError("checkpoint has LoRA weights but its `args` lack lora_rank/lora_alpha; "
                                  "pass scaling=alpha/rank")
        scaling = float(args["lora_alpha"]) / float(args["lora_rank"])
    out = dict(sd)
    missing_base = []
    for name in lora_names:
        base_key = f"{name}.base_weight" if f"{name}.base_weight" in sd else f"{name}.weight"
        if base_key not in sd:
            missing_base.append(name)
            continue
        A, B = out.pop(f"{name}.lora_A"), out.pop(f"{name}.lora_B")
        base = out.pop(base_key)
        out[f"{name}.weight"] = (base.float() + (B.float() @ A.float()) * scaling).to(base.dtype)
    if missing_base:
        raise CheckpointError(
            f"LoRA-only checkpoint: {len(missing_base)} LoRA adapters have no base weight "
            f"(e.g. {missing_base[:3]}); load the base model and merge the adapters into it instead")
    return out


# ---- strict loading with readable errors -------------------------------------------------------------
class CheckpointMismatchError(WeightMismatchError):
    """A checkpoint that does not fit the model built from the config (worded for checkpoints)."""

    @staticmethod
    def shape_line(key: str, got: tuple[int, ...], want: tuple[int, ...]) -> str:
        return f"{key}: checkpoint {got} vs model {want}"

    def describe(self) -> str:
        lines = [f"checkpoint does not fit {self.source}:"]
        for title, items in (("missing keys", self.missing), ("unexpected keys", self.unexpected),
                             ("shape mismatches", self.wrong_shape)):
            if items:
                shown = ", ".join(items[:12]) + (f", ... ({len(items)} in all)" if len(items) > 12 else "")
                lines.append(f"  {title}: {shown}")
        return "\n".join(lines)


def _fitted(sd: StateDict, own: StateDict, what: str) -> StateDict:
    """The checkpoint with its derived buffers dropped and the model's own values taken instead, checked
    against the model's state dict ``own`` (every mismatch in one CheckpointMismatchError)."""
    out = {k: v for k, v in sd.items() if not _DERIVED.search(k)}
    for k, v in own.items():
        if _DERIVED.search(k):
            out[k] = v
    check_state_dict(out, own, source=what, error=CheckpointMismatchError)
    return out


def load_vqvae(path_or_sd, cfg: VQVAEConfig) -> MultiScaleVQVAE:
    """The tokenizer from `vae_ch160v4096z32.pth`-style or project safetensors weights."""
    sd, _ = read_state(path_or_sd)
    model = MultiScaleVQVAE(cfg)
    own = model.state_dict()
    hit = "quantize.ema_vocab_hit_SV"
    if hit in sd and sd[hit].shape != own[hit].shape:  # training statistics only
        sd = {**sd, hit: own[hit]}
    model.load_state_dict(_fitted(sd, own, f"MultiScaleVQVAE({cfg.ch}ch, V={cfg.vocab_size}, Cvae={cfg.z_channels})"))
    return model.eval()


def stylevar_reference_to_own(sd: StateDict, dim: int) -> StateDict:
    """Reference StyleVAR layout -> this project's (Q rows of the guide, K/V rows of the target)."""
    out = {}
    for k, v in sd.items():
        m = _ATTN_REF.match(k)
        if not m:
            out[k] = v
            continue
        i, leaf = m.groups()
        pre = f"blocks.{i}.attn."
        if leaf == "mat_qkv_guide.weight":
            out[pre + "q_guide.weight"] = v[:dim]
        elif leaf == "mat_qkv_target.weight":
            out[pre + "kv_target.weight"] = v[dim:]
        elif leaf == "q_bias_guide":
            out[pre + "q_guide.bias"] = v
        elif leaf == "v_bias_target":
            out[pre + "v_bias"] = v
        # q_bias_target and v_bias_guide feed rows that are never used
    return out


def load_stylevar(path_or_sd, cfg: StyleVARConfig, vqvae: MultiScaleVQVAE, *,
                  lora_scaling: float | None = None) -> StyleVAR:
    """StyleVAR from a reference checkpoint (any published layout, LoRA baked) or project weights."""
    sd, args = read_state(path_or_sd)
    sd = bake_lora(sd, args, lora_scaling)
    if any(k.startswith("tokenizer.") for k in sd):
        sd = {k: v for k, v in sd.items() if not k.startswith("tokenizer.")}
    if any(_ATTN_REF.match(k) for k in sd):
        sd = stylevar_reference_to_own(sd, cfg.embed_dim)
    model = StyleVAR(cfg, vqvae)
    own = model.transformer_state_dict()
    model.load_transformer_state_dict(_fitted(sd, own, f"StyleVAR(depth={cfg.depth}, dim={cfg.embed_dim}, "
                                                       f"V={cfg.vocab_size})"))
    return model.eval()


def init_from_var(path_or_sd, cfg: StyleVARConfig, vqvae: MultiScaleVQVAE) -> tuple[StyleVAR, dict]:
    """A StyleVAR initialised from a class-conditional VAR checkpoint, and what was copied, split, dropped
    and left fresh. Each block's `mat_qkv`/`q_bias`/`v_bias` go to both the guide (Q) and the target
    (K, V) projections; `class_emb` has no counterpart; encoders and `feat_emb` start fresh (ResNet-18
    trunks from torchvision ImageNet weights when those are in the cache)."""
    sd, _ = read_state(path_or_sd)
    model = StyleVAR(cfg, vqvae)
    own = model.transformer_state_dict()
    new: StateDict = {}
    summary: dict[str, Any] = {"copied": [], "split": {}, "dropped": [], "fresh": [], "encoders": "random"}
    C = cfg.embed_dim
    for k, v in sd.items():
        m = re.match(r"^blocks\.(\d+)\.attn\.(mat_qkv\.weight|q_bias|v_bias)$", k)
        if m:
            pre = f"blocks.{m.group(1)}.attn."
            if m.group(2) == "mat_qkv.weight":
                new[pre + "q_guide.weight"], new[pre + "kv_target.weight"] = v[:C], v[C:]
                summary["split"][k] = [pre + "q_guide.weight", pre + "kv_target.weight"]
            elif m.group(2) == "q_bias":
                new[pre + "q_guide.bias"] = v
                summary["split"][k] = [pre + "q_guide.bias"]
            else:
                new[pre + "v_bias"] = v
                summary["split"][k] = [pre + "v_bias"]
        elif k in own and not _DERIVED.search(k):
            if own[k].shape != v.shape:
                raise CheckpointError(f"VAR checkpoint entry {k} has shape {tuple(v.shape)}, "
                                      f"StyleVAR expects {tuple(own[k].shape)}: wrong preset?")
            new[k] = v
            summary["copied"].append(k)
        else:
            summary["dropped"].append(k)
    if not summary["split"]:
        raise CheckpointError("not a class-conditional VAR checkpoint: no blocks.*.attn.mat_qkv.weight entries")
    encoder_state = _imagenet_resnet18() if cfg.image_encoder == "resnet18" else None
    if encoder_state is not None:
        for enc in ("style_encoder", "content_encoder"):
            new.update({f"{enc}.{k}": v for k, v in encoder_state.items()})
        summary["encoders"] = "imagenet"
    for k, v in own.items():
        if k not in new:
            new[k] = v
            summary["fresh"].append(k)
    model.load_transformer_state_dict(new)
    return model, summary


def _imagenet_resnet18() -> StateDict | None:
    """torchvision's ImageNet ResNet-18 trunk (conv1..layer4) when the weights are in the cache, else None."""
    try:
        from stylevar import weights
        path = weights.resolve("resnet18")
    except (ImportError, LookupError, FileNotFoundError):
        return None
    sd = read_state_dict(path)
    names = {"conv1": "0", "bn1": "1", "layer1": "4", "layer2": "5", "layer3": "6", "layer4": "7"}
    return {names[k.split(".", 1)[0]] + "." + k.split(".", 1)[1]: v for k, v in sd.items()
            if k.split(".", 1)[0] in names}
