"""The reference-format checkpoint converter: the published layouts in, this project's models out.

The reference's full (3C, C) qkv matrices load into `q_guide` and `kv_target` (the only rows used); derived
buffers are recomputed, and the models' `from_state_dict` checks the result.
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping

from stylevar.config import StyleVARConfig, VQVAEConfig
from stylevar.models.state_dict import CheckpointError, StateDict, is_state_dict, read_file
from stylevar.models.tokenizer import MultiScaleVQVAE
from stylevar.models.transformer import StyleVAR

_ATTN_REF = re.compile(r"^blocks\.(\d+)\.attn\.(mat_qkv_guide\.weight|mat_qkv_target\.weight|q_bias_guide|"
                       r"v_bias_guide|q_bias_target|v_bias_target)$")


def read_state(path_or_sd: str | os.PathLike | Mapping[str, Any]) -> tuple[StateDict, dict]:
    """A state dict (and the checkpoint's `args`, if any) from a file or an in-memory checkpoint: a plain state
    dict, `{"model": sd}` or `{"trainer": {"var_wo_ddp": sd}}` (files read by `state_dict.read_file`)."""
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


def load_vqvae(path_or_sd, cfg: VQVAEConfig) -> MultiScaleVQVAE:
    """The tokenizer from `vae_ch160v4096z32.pth`-style or project safetensors weights."""
    return MultiScaleVQVAE.from_state_dict(read_state(path_or_sd)[0], cfg)


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
    return StyleVAR.from_state_dict(sd, cfg, vqvae)
