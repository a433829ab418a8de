"""Configuration dataclasses: the tokenizer's and the transformer's, with named presets, and the settings of one
generation (`GenerationConfig`, its defaults `DEFAULT_GENERATION`). No torch.

`d16` ... `d30` are the published StyleVAR shapes; `tiny` is the CPU-sized configuration of the demo model.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

OFFICIAL_PATCH_NUMS = (1, 2, 3, 4, 5, 6, 8, 10, 13, 16)
TINY_PATCH_NUMS = (1, 2, 3, 4, 6, 8)
PRESETS = ("tiny", "d16", "d20", "d24", "d30")
# a model directory's files: config.json (each model's section, and the pipeline's) and each model's weights
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.safetensors"  # MultiScaleVQVAE.weights_file
TRANSFORMER_FILE = "transformer.safetensors"  # StyleVAR.weights_file


def reference_drop_path_rate(depth: int) -> float:
    """The stochastic-depth rate the reference (and VAR) train a depth-``depth`` model with: 0.1 * depth / 24."""
    return 0.1 * depth / 24


def _linspace(lo: float, hi: float, n: int) -> tuple[float, ...]:
    if n == 1:
        return (lo,)
    return tuple(round(lo + (hi - lo) * i / (n - 1), 6) for i in range(n))


class Serializable:
    """A frozen dataclass in a config.json section (lists for tuples); an unknown field: error; no section: defaults."""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)  # type: ignore[arg-type]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None):
        d = d or {}
        names = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown fields {unknown}")
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        return cls(**kw)


@dataclass(frozen=True)
class VQVAEConfig(Serializable):
    """VAR's multi-scale VQ-VAE. Downsampling factor is 2 ** (len(ch_mult) - 1)."""

    vocab_size: int = 4096  # V
    z_channels: int = 32  # Cvae, the code dimension
    ch: int = 160
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    patch_nums: tuple[int, ...] = OFFICIAL_PATCH_NUMS
    share_quant_resi: int = 4  # number of (partially shared) Phi convs
    quant_resi: float = 0.5  # Phi(h) = (1 - r) h + r conv(h)
    beta: float = 0.25  # commitment weight (training only)
    using_sa: bool = True
    using_mid_sa: bool = True
    dropout: float = 0.0
    norm_groups: int = 32  # GroupNorm groups (published: 32); narrow models need fewer, or colour is normalised away
    # opt-in (1 in every published preset): the stem pixel-unshuffles the image by this factor, the head shuffles back
    space_to_channel: int = 1

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1) * self.space_to_channel

    @property
    def image_size(self) -> int:
        return self.patch_nums[-1] * self.downsample

    @property
    def num_tokens(self) -> int:
        return sum(pn * pn for pn in self.patch_nums)

    @classmethod
    def preset(cls, name: str) -> "VQVAEConfig":
        if name == "tiny":
            # 64 px through an 8 x 8 latent (downsampling 8), 6 scales, 130 tokens: trainable on a CPU
            return cls(vocab_size=512, z_channels=16, ch=32, ch_mult=(1, 2, 2, 4), num_res_blocks=1,
                       patch_nums=TINY_PATCH_NUMS, norm_groups=8)
        if name in PRESETS:
            return cls()
        raise ValueError(f"unknown preset {name!r}; choose from {PRESETS}")

    @classmethod
    def from_reference(cls, d: dict[str, Any]) -> "VQVAEConfig":
        """From the fields of a reference config.json (patch_nums, V, Cvae, ch, share_quant_resi)."""
        return cls(vocab_size=int(d["V"]), z_channels=int(d["Cvae"]), ch=int(d["ch"]),
                   patch_nums=tuple(int(p) for p in d["patch_nums"]),
                   share_quant_resi=int(d.get("share_quant_resi", 4)))


@dataclass(frozen=True)
class StyleVARConfig(Serializable):
    """The blended-attention transformer. Width and head count default to VAR's 64*depth and depth."""

    depth: int = 16
    embed_dim: int = 0  # 0 -> 64 * depth
    num_heads: int = 0  # 0 -> depth
    mlp_ratio: float = 4.0
    attn_l2_norm: bool = True
    norm_eps: float = 1e-6
    patch_nums: tuple[int, ...] = OFFICIAL_PATCH_NUMS
    vocab_size: int = 4096
    z_channels: int = 32
    alpha_nums: tuple[float, ...] = field(default_factory=lambda: _linspace(0.2, 0.8, len(OFFICIAL_PATCH_NUMS)))
    image_encoder: str = "resnet18"  # "resnet18" (official) or "cnn" (tiny)
    encoder_dim: int = 512
    dropout: float = 0.0
    # opt-in zero-initialised maps (off when published): content tokens into the inputs, colour stats into AdaLN
    content_injection: bool = False
    colour_stats: bool = False
    # stochastic depth in training only (block i at linspace(0, rate, depth)[i]); 0 is off
    drop_path_rate: float = 0.0

    def __post_init__(self):
        if self.embed_dim == 0:
            object.__setattr__(self, "embed_dim", 64 * self.depth)
        if self.num_heads == 0:
            object.__setattr__(self, "num_heads", self.depth)
        if len(self.alpha_nums) != len(self.patch_nums):
            raise ValueError(f"alpha_nums has {len(self.alpha_nums)} values for {len(self.patch_nums)} scales")
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        if self.image_encoder not in ("resnet18", "cnn"):
            raise ValueError(f"image_encoder must be 'resnet18' or 'cnn', not {self.image_encoder!r}")
        if not 0.0 <= self.drop_path_rate < 1.0:
            raise ValueError(f"drop_path_rate must lie in [0, 1), not {self.drop_path_rate}")

    @property
    def num_tokens(self) -> int:
        return sum(pn * pn for pn in self.patch_nums)

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def drop_path_rates(self) -> tuple[float, ...]:
        """Each block's drop probability in training: linspace(0, drop_path_rate, depth)."""
        if self.depth == 1:
            return (0.0,)
        return tuple(self.drop_path_rate * i / (self.depth - 1) for i in range(self.depth))

    @classmethod
    def preset(cls, name: str) -> "StyleVARConfig":
        if name == "tiny":
            return cls(depth=4, embed_dim=256, num_heads=4, patch_nums=TINY_PATCH_NUMS, vocab_size=512, z_channels=16,
                       alpha_nums=_linspace(0.2, 0.7, len(TINY_PATCH_NUMS)), image_encoder="cnn", encoder_dim=256)
        if name in ("d16", "d20", "d24", "d30"):
            depth = int(name[1:])
            return cls(depth=depth, drop_path_rate=reference_drop_path_rate(depth))
        raise ValueError(f"unknown preset {name!r}; choose from {PRESETS}")

    @classmethod
    def from_reference(cls, d: dict[str, Any]) -> "StyleVARConfig":
        """From a reference config.json; the drop-path rate is the reference's (`reference_drop_path_rate`)."""
        patch_nums = tuple(int(p) for p in d["patch_nums"])
        alphas = d.get("alpha_nums")
        depth = int(d["depth"])
        return cls(depth=depth, patch_nums=patch_nums, vocab_size=int(d["V"]), z_channels=int(d["Cvae"]),
                   attn_l2_norm=bool(d.get("attn_l2_norm", True)),
                   alpha_nums=tuple(float(a) for a in alphas) if alphas else _linspace(0.2, 0.8, len(patch_nums)),
                   drop_path_rate=float(d.get("drop_path_rate", reference_drop_path_rate(depth))))


def presets(name: str) -> tuple[VQVAEConfig, StyleVARConfig]:
    """Both configurations of a named preset."""
    return VQVAEConfig.preset(name), StyleVARConfig.preset(name)


@dataclass(frozen=True)
class GenerationConfig:
    top_k: int = 900  # 0 switches top-k off
    top_p: float = 0.96  # 0 or 1 switches nucleus sampling off
    seed: int | Sequence[int] | None = None  # one for the batch, or one per row; None: a random one
    style_strength: float = 0.0  # -1 keeps more of the content .. 1 takes more of the style
    alphas: Sequence[float] | None = None  # the blend weight of each scale (a tensor too); None: the model's
    guidance: float = 0.0  # >= 0: push away from the prediction without the style; 0: the plain model
    fast: bool = False  # prune the finest scales' computation (the model's `fast_sampling` plan)

    @classmethod
    def from_kwargs(cls, settings: Mapping[str, Any]) -> GenerationConfig:
        """From keyword settings, None meaning unset (the default). An unknown name is a TypeError."""
        return cls(**{k: v for k, v in settings.items() if v is not None})

    @classmethod
    def resolve(cls, recommended: Mapping[str, Any], **settings: Any) -> GenerationConfig:
        """The caller's ``settings`` (None = unset) over a model's ``recommended`` ones over the defaults."""
        return cls.from_kwargs({**recommended, **{k: v for k, v in settings.items() if v is not None}})

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `StyleVAR.generate`."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


DEFAULT_GENERATION = GenerationConfig()
