"""LoRA adapters on StyleVAR's linear layers: attach, switch off, snapshot, merge, remove.

A wrapped linear keeps its frozen ``base_weight`` and learns ``W = base_weight + alpha / r * lora_B @ lora_A``
(``lora_B`` starts at zero), named as the published GRPO checkpoints are, and exposes the effective ``weight``.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import nn

# linears inside each block `blocks[i]` that GRPO adapts
DEFAULT_TARGETS = ("attn.q_guide", "attn.kv_target", "attn.proj", "ffn.fc1", "ffn.fc2")


class LoRAError(ValueError):
    """LoRA requested on a module that cannot take it, or LoRA state that does not fit the model."""


@dataclass(frozen=True)
class LoRAConfig:
    rank: int = 256  # r (paper: 256)
    alpha: float = 512.0  # paper: 512; scaling = alpha / rank
    targets: tuple[str, ...] = DEFAULT_TARGETS  # module paths relative to each block

    def __post_init__(self):
        if self.rank < 1:
            raise LoRAError(f"LoRA rank must be >= 1, got {self.rank}")
        if not self.alpha > 0:
            raise LoRAError(f"LoRA alpha must be > 0, got {self.alpha}")
        if not self.targets:
            raise LoRAError("LoRA needs at least one target module")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def to_dict(self) -> dict:
        return {"rank": self.rank, "alpha": self.alpha, "targets": list(self.targets)}


class LoRALinear(nn.Module):
    """``y = x @ base_weight.T + bias + scaling * (x @ lora_A.T) @ lora_B.T`` (the last term only when enabled)."""

    def __init__(self, base: nn.Linear, rank: int, scaling: float, generator: torch.Generator | None = None):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise LoRAError(f"LoRA wraps nn.Linear, not {type(base).__name__}")
        self.in_features, self.out_features = base.in_features, base.out_features
        self.rank, self.scaling = rank, float(scaling)
        w = base.weight
        self.base_weight = nn.Parameter(w.detach(), requires_grad=False)  # shares the base's storage
        self.bias = None if base.bias is None else nn.Parameter(base.bias.detach(), requires_grad=False)
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, device=w.device, dtype=w.dtype))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, device=w.device, dtype=w.dtype))
        self.enabled = True
        self.restart(generator)

    @torch.no_grad()
    def restart(self, generator: torch.Generator | None = None) -> None:
        """A fresh adapter: A ~ kaiming-uniform (a = sqrt 5, as nn.Linear), B = 0 (so the update is zero)."""
        bound = 1.0 / math.sqrt(self.in_features)  # kaiming_uniform_(a=sqrt(5)) on a (r, in) matrix
        a = torch.rand(self.lora_A.shape, generator=generator, dtype=torch.float32) * 2 - 1
        self.lora_A.copy_(a.mul_(bound))
        self.lora_B.zero_()

    def delta_weight(self) -> torch.Tensor:
        """scaling * B @ A, (out, in)."""
        return (self.lora_B @ self.lora_A) * self.scaling

    @property
    def weight(self) -> torch.Tensor:
        """The effective weight (out, in): base + update when enabled, the base when disabled."""
        if not self.enabled:
            return self.base_weight
        return self.base_weight + self.delta_weight().to(self.base_weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.base_weight, self.bias)
        if self.enabled:
            y = y + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scaling
        return y

    @torch.no_grad()
    def merge_(self) -> None:
        """base_weight += scaling * B @ A (computed in fp32)."""
        delta = (self.lora_B.float() @ self.lora_A.float()) * self.scaling
        self.base_weight.copy_((self.base_weight.float() + delta).to(self.base_weight.dtype))

    @torch.no_grad()
    def to_linear(self, merge: bool = True) -> nn.Linear:
        """A plain nn.Linear with the base weight (plus the update when ``merge`` and enabled)."""
        w = self.base_weight.float() + (self.delta_weight().float() if merge and self.enabled else 0.0)
        lin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                        device=self.base_weight.device, dtype=self.base_weight.dtype)
        lin.weight.copy_(w.to(lin.weight.dtype))
        if self.bias is not None:
            lin.bias.copy_(self.bias)
        return lin

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, "
                f"scaling={self.scaling:g}, enabled={self.enabled}")


def _blocks(model: nn.Module) -> nn.ModuleList:
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise LoRAError(f"{type(model).__name__} has no `blocks` ModuleList to put LoRA adapters in")
    return blocks


def _split(path: str) -> tuple[str, str]:
    parent, _, leaf = path.rpartition(".")
    return parent, leaf


def attach_lora(model: nn.Module, cfg: LoRAConfig, *, seed: int = 0) -> list[str]:
    """Wrap ``cfg.targets`` of every block in :class:`LoRALinear` and freeze everything else; returns the wrapped
    module names. The A matrices come from a private generator seeded with ``seed``."""
    if lora_modules(model):
        raise LoRAError("the model already has LoRA adapters")
    blocks = _blocks(model)
    generator = torch.Generator().manual_seed(seed)
    plan: list[tuple[nn.Module, str, nn.Linear, str]] = []
    for i, blk in enumerate(blocks):
        for target in cfg.targets:
            parent_path, leaf = _split(target)
            try:
                parent = blk.get_submodule(parent_path) if parent_path else blk
                mod = getattr(parent, leaf)
            except AttributeError:
                raise LoRAError(f"blocks.{i} has no module {target!r}") from None
            if not isinstance(mod, nn.Linear):
                raise LoRAError(f"blocks.{i}.{target} is a {type(mod).__name__}, LoRA needs an nn.Linear")
            plan.append((parent, leaf, mod, f"blocks.{i}.{target}"))
    model.requires_grad_(False)
    for parent, leaf, mod, _ in plan:
        setattr(parent, leaf, LoRALinear(mod, cfg.rank, cfg.scaling, generator))
    return [name for *_, name in plan]


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    """{module name: adapter}, in module order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def _require(model: nn.Module) -> dict[str, LoRALinear]:
    mods = lora_modules(model)
    if not mods:
        raise LoRAError("the model has no LoRA adapters (call attach_lora first)")
    return mods


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The trainable LoRA matrices (A and B of every adapter)."""
    return [p for m in _require(model).values() for p in (m.lora_A, m.lora_B)]


@contextlib.contextmanager
def lora_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block the model computes with its base weights only (the GRPO reference policy)."""
    mods = _require(model)
    before = {name: m.enabled for name, m in mods.items()}
    for m in mods.values():
        m.enabled = False
    try:
        yield model
    finally:
        for name, m in mods.items():
            m.enabled = before[name]


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``{<module>.lora_A, <module>.lora_B: tensor}`` (views of the live parameters)."""
    out: dict[str, torch.Tensor] = {}
    for name, m in _require(model).items():
        out[f"{name}.lora_A"] = m.lora_A.detach()
        out[f"{name}.lora_B"] = m.lora_B.detach()
    return out


def snapshot_lora(model: nn.Module, device: str | torch.device | None = None) -> dict[str, torch.Tensor]:
    """A copy of every adapter's A and B (on ``device``, default where they live)."""
    return {k: v.to(device, copy=True) if device is not None else v.clone() for k, v in lora_state_dict(model).items()}


@torch.no_grad()
def load_lora_state_dict(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy A and B from ``state`` (a :func:`lora_state_dict` / :func:`snapshot_lora`) into the adapters."""
    own = lora_state_dict(model)
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [f"{k}: {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in own
              if k in state and state[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        raise LoRAError(f"LoRA state does not fit the model: missing {missing[:4]}, unexpected {unexpected[:4]}, "
                        f"shape mismatches {shapes[:4]}")
    for k, v in own.items():
        v.copy_(state[k])


@torch.no_grad()
def merge_lora(model: nn.Module, *, restart: bool = True, generator: torch.Generator | None = None) -> None:
    """Bake every adapter's update into its base weight; with ``restart`` the adapters start again at
    zero (A redrawn from ``generator``, B = 0), so the model computes the same before and after."""
    for m in _require(model).values():
        m.merge_()
        if restart:
            m.restart(generator)
        else:
            m.lora_B.zero_()


@torch.no_grad()
def unload_lora(model: nn.Module, *, merge: bool = True) -> nn.Module:
    """Replace every adapter by a plain nn.Linear (its update merged when ``merge``); returns the model."""
    for name, m in _require(model).items():
        parent_path, leaf = _split(name)
        parent = model.get_submodule(parent_path) if parent_path else model
        setattr(parent, leaf, m.to_linear(merge=merge))
    return model

