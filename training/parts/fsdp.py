"""Fully sharded data parallel training (FSDP2): ``training.sft --strategy fsdp``.

Weights, gradients and AdamW state are sharded per transformer block (with its AdaLN projection) and the root;
the frozen tokenizer stays whole. Checkpoints load at any world size; :func:`export_model_dir` makes a model directory.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch
import torch.distributed as dist
from torch import nn

from stylevar.utils.atomic import is_write_error, remove_quietly, replace_folder, temp_folder, write_failure
from training.parts.checkpoints import SHARDED_SUFFIX, newest_checkpoint, read_checkpoint
from training.parts.rundir import CONFIG_NAME


def precision_policies(precision: str) -> dict[str, Any]:
    """The mixed-precision policy of ``"blocks"`` (bf16 gathers) and ``"root"`` (fp32); grads reduced in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    block_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    return {kind: MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
            for kind, dtype in (("blocks", block_dtype), ("root", torch.float32))}


def shard_model(root: nn.Module, model: nn.Module, env, precision: str) -> nn.Module:
    """``root`` (running ``model``) sharded in place with :func:`precision_policies`; one process: unchanged."""
    if not env.distributed:
        return root
    from torch.distributed.fsdp import fully_shard
    policies = precision_policies(precision)
    for block in model.blocks:
        fully_shard(block.ada_lin, mp_policy=policies["blocks"])
        fully_shard(block, mp_policy=policies["blocks"])
    fully_shard(root, mp_policy=policies["root"], ignored_params=set(model.tokenizer.parameters()))
    return root


def is_sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule
    return isinstance(module, FSDPModule)


@contextlib.contextmanager
def gathered(module: nn.Module) -> Iterator[None]:
    """The root's own parameters whole for the duration (e.g. a validation pass); a no-op when unsharded."""
    if not is_sharded(module):
        yield
        return
    module.unshard()
    try:
        yield
    finally:
        module.reshard()


def _state_dicts(module: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    out = {"model": get_model_state_dict(module)}
    if optimizer is not None:
        out["optimizer"] = get_optimizer_state_dict(module, optimizer)
    return out


def save_sharded(folder: Path, module: nn.Module, optimizer: torch.optim.Optimizer, env) -> None:
    """Every rank writes its shards to ``folder`` (renamed by rank 0); a failure: `WriteFailedError` on every rank."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import CheckpointException
    tmp = temp_folder(folder)
    if env.is_main:
        remove_quietly(tmp)
    env.barrier()
    try:
        dcp.save(_state_dicts(module, optimizer), checkpoint_id=str(tmp), no_dist=not env.distributed)
    except (Exception, CheckpointException) as e:
        if not is_write_error(e):
            raise
        failure = write_failure(folder, e, what="sharded checkpoint", partial=tmp if env.is_main else None)
        env.barrier()  # every rank has its failure before any leaves the process group
        raise failure from e
    env.barrier()
    if env.is_main:
        replace_folder(tmp, folder)
    env.barrier()


def load_sharded(folder: str | os.PathLike, module: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Load a :func:`save_sharded` folder into ``module`` (at any world size) and ``optimizer`` (when given)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
    state = _state_dicts(module, optimizer)
    dcp.load(state, checkpoint_id=str(folder), no_dist=not (dist.is_available() and dist.is_initialized()))
    set_model_state_dict(module, state["model"])
    if optimizer is not None:
        set_optimizer_state_dict(module, optimizer, state["optimizer"])


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """The whole state dict on the CPU of rank 0 (every rank calls it; the others get an empty dict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def strip_prefix(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def export_model_dir(checkpoint: str | os.PathLike, out: str | os.PathLike) -> Path:
    """A model directory from a ``--strategy fsdp`` checkpoint, built in this process (no process group)."""
    from stylevar.config import StyleVARConfig, VQVAEConfig
    from stylevar.pipelines.pipeline import StylePipeline
    from stylevar.models.tokenizer import MultiScaleVQVAE
    from stylevar.models.transformer import StyleVAR
    pt = newest_checkpoint(checkpoint, sharded=True)
    run_root = pt.parent.parent
    config = json.loads((run_root / CONFIG_NAME).read_text())
    if config.get("recipe") != "sft":
        raise ValueError(f"{run_root} is not a training.sft run")
    model = StyleVAR(StyleVARConfig.from_dict(config["transformer_config"]),
                     MultiScaleVQVAE(VQVAEConfig.from_dict(config["tokenizer_config"])))
    holder = nn.Module()
    holder.model = model  # the checkpoint's names are the objective's: "model.<name>"
    load_sharded(pt.with_suffix(SHARDED_SUFFIX), holder)
    step = int(read_checkpoint(pt)["step"])
    extra = {"recipe": "sft", "steps": step, "data": config.get("data"), "batch_size": config.get("batch_size"),
             "lr": config.get("lr"), "exported_from": str(pt)}
    return StylePipeline.from_models(model.eval(), name=config.get("name", "stylevar-sft"),
                                     extra=extra).save_pretrained(out)
