"""StyleVAR initialised from a class-conditional VAR checkpoint (`training.sft --init-var`).

Each block's `mat_qkv` / `q_bias` / `v_bias` are split between the guide (Q) and the target (K, V) projections;
`class_emb` is dropped; what VAR lacks starts fresh (ResNet-18 trunks from ImageNet weights when cached).
"""
from __future__ import annotations

import re
from typing import Any

from stylevar.loaders import weights
from stylevar.config import StyleVARConfig
from stylevar.loaders.convert import read_state
from stylevar.models.state_dict import DERIVED_KEYS, CheckpointError, StateDict, read_state_dict
from stylevar.models.tokenizer import MultiScaleVQVAE
from stylevar.models.transformer import StyleVAR


def init_from_var(path_or_sd, cfg: StyleVARConfig, vqvae: MultiScaleVQVAE) -> tuple[StyleVAR, dict]:
    """A StyleVAR from a class-conditional VAR checkpoint, and what was copied, split, dropped and left fresh."""
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
        elif k in own and not DERIVED_KEYS.search(k):
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
        path = weights.resolve("resnet18")
    except (LookupError, FileNotFoundError):
        return None
    sd = read_state_dict(path)
    names = {"conv1": "0", "bn1": "1", "layer1": "4", "layer2": "5", "layer3": "6", "layer4": "7"}
    return {names[k.split(".", 1)[0]] + "." + k.split(".", 1)[1]: v for k, v in sd.items()
            if k.split(".", 1)[0] in names}
