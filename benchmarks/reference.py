"""The public reference StyleVAR (https://github.com/Senfier-LiqiJing/StyleVAR, a checkout on PYTHONPATH) and
this project's models at the reference-shaped configuration, from the same seeded random weights, for
`benchmarks.cpu_pipeline --reference` and `benchmarks.train_step`. Nothing is downloaded.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import tempfile
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torchvision
from torch import nn

from stylevar.config import StyleVARConfig, VQVAEConfig

# the configuration in the reference's own config.json fields (as in its golden_small config, at 160 px)
REFERENCE_CONFIG = {"patch_nums": [1, 2, 3, 4, 5, 6, 8, 10], "V": 4096, "Cvae": 32, "ch": 32, "share_quant_resi": 4,
                    "depth": 8, "attn_l2_norm": True}
REFERENCE_URL = "https://github.com/Senfier-LiqiJing/StyleVAR"
TOP_K, TOP_P = 900, 0.96  # the reference's inference defaults (eval/infer_grpo.py, eval/eval_pipeline.py)

# PyTorch's own initialisers, kept before the reference's builder replaces them with no-ops
_DEFAULT_RESET = {cls: cls.reset_parameters for cls in (nn.Linear, nn.LayerNorm, nn.BatchNorm2d, nn.Conv1d,
                                                        nn.Conv2d, nn.ConvTranspose1d, nn.ConvTranspose2d)}


class ReferenceMissing(RuntimeError):
    pass


def import_reference() -> types.ModuleType:
    """The reference's `models` package, with a stand-in `dist` module when none is importable."""
    if importlib.util.find_spec("dist") is None:
        dist = types.ModuleType("dist")
        dist.get_device = lambda: torch.device("cpu")  # type: ignore[attr-defined]
        dist.initialized = lambda: False  # type: ignore[attr-defined]
        # what the reference's trainer asks of it (benchmarks.train_step), as one CPU process
        dist.get_world_size, dist.get_rank = (lambda: 1), (lambda: 0)  # type: ignore[attr-defined]
        dist.is_master, dist.barrier = (lambda: True), (lambda: None)  # type: ignore[attr-defined]
        dist.allreduce = lambda *a, **k: None  # type: ignore[attr-defined]
        sys.modules["dist"] = dist
    try:
        import models  # the reference's package
    except ImportError as e:
        raise ReferenceMissing(str(e)) from e
    if not hasattr(models, "build_vae_stylevar"):
        raise ReferenceMissing(f"'models' at {getattr(models, '__file__', '?')} has no build_vae_stylevar")
    return models


@dataclass
class ReferenceBundle:
    vae: nn.Module
    model: nn.Module


@contextlib.contextmanager
def _random_resnet18_weights(seed: int):
    """A temporary TORCH_HOME whose hub cache holds a random resnet18 under the IMAGENET1K_V1 file name."""
    url = torchvision.models.ResNet18_Weights.IMAGENET1K_V1.url
    old = os.environ.get("TORCH_HOME")
    with tempfile.TemporaryDirectory() as home:
        ckpt_dir = os.path.join(home, "hub", "checkpoints")
        os.makedirs(ckpt_dir)
        torch.manual_seed(seed)
        torch.save(torchvision.models.resnet18(weights=None).state_dict(),
                   os.path.join(ckpt_dir, os.path.basename(url)))
        os.environ["TORCH_HOME"] = home
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("TORCH_HOME", None)
            else:
                os.environ["TORCH_HOME"] = old


def _default_init(module: nn.Module) -> None:
    for m in module.modules():
        reset = next((_DEFAULT_RESET[c] for c in type(m).__mro__ if c in _DEFAULT_RESET), None)
        if reset is not None:
            reset(m)


def build_reference(seed: int = 0) -> ReferenceBundle:
    """The reference's VQ-VAE + StyleVAR at REFERENCE_CONFIG: random weights (seeded), eval, fp32, CPU."""
    models = import_reference()
    cfg = REFERENCE_CONFIG
    with _random_resnet18_weights(seed), contextlib.redirect_stdout(sys.stderr):
        torch.manual_seed(seed)
        vae, model = models.build_vae_stylevar(
            device=torch.device("cpu"), patch_nums=tuple(cfg["patch_nums"]), V=cfg["V"], Cvae=cfg["Cvae"],
            ch=cfg["ch"], share_quant_resi=cfg["share_quant_resi"], depth=cfg["depth"], shared_aln=False,
            attn_l2_norm=cfg["attn_l2_norm"], flash_if_available=True, fused_if_available=True,
            init_adaln=0.5, init_adaln_gamma=1e-5, init_head=0.02, init_std=-1, style_enc_dim=512,
            alpha_nums=StyleVARConfig.from_reference(cfg).alpha_nums)
    for cls, reset in _DEFAULT_RESET.items():  # the builder replaced them process-wide: put them back
        cls.reset_parameters = reset
    torch.manual_seed(seed)
    _default_init(vae)
    return ReferenceBundle(vae.float().eval(), model.float().eval())


def reference_shaped() -> tuple[VQVAEConfig, StyleVARConfig]:
    """The reference-shaped configuration: 160 px, 8 scales up to 10 x 10, V 4096, depth 8."""
    vq = VQVAEConfig.from_reference(REFERENCE_CONFIG)
    assert vq.image_size == 160
    return vq, StyleVARConfig.from_reference(REFERENCE_CONFIG)


def reference_weights(vqvae_sd: dict, stylevar_sd: dict):
    """This project's reference-shaped StyleVAR with the reference's weights (through its own loaders)."""
    from stylevar.loaders.convert import load_stylevar, load_vqvae

    vq_cfg, tr_cfg = reference_shaped()
    return load_stylevar(stylevar_sd, tr_cfg, load_vqvae(vqvae_sd, vq_cfg))


def images(batch: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded random content and style batches, (B, 3, size, size) in [-1, 1]."""
    g = torch.Generator().manual_seed(seed)
    content = torch.rand(batch, 3, size, size, generator=g) * 2 - 1
    style = torch.rand(batch, 3, size, size, generator=g) * 2 - 1
    return content, style


def reference_generate(bundle: ReferenceBundle, content_B3HW: torch.Tensor, style_B3HW: torch.Tensor,
                       seed: int, top_k: int = TOP_K, top_p: float = TOP_P) -> torch.Tensor:
    """The reference's whole inference call, as eval/infer_grpo.py makes it: images in [-1, 1] in, [0, 1] out."""
    return bundle.model.autoregressive_infer(B=content_B3HW.shape[0], style_img=style_B3HW,
                                             content_img=content_B3HW, top_k=top_k, top_p=top_p, g_seed=seed)


def missing_message(e: ReferenceMissing) -> str:
    return f"cannot import the reference StyleVAR ({e}); put a checkout of {REFERENCE_URL} on PYTHONPATH"


def reference_stage_fns(bundle: ReferenceBundle, content: torch.Tensor, style: torch.Tensor) -> dict[str, Callable]:
    """One call of each of the reference's stages and of its whole inference, named as cpu_pipeline's STAGES."""
    vae, m = bundle.vae, bundle.model
    f_hat = torch.randn(content.shape[0], m.Cvae, m.patch_nums[-1], m.patch_nums[-1],
                        generator=torch.Generator().manual_seed(0))
    return {
        "encode": lambda: (vae.img_to_idxBl(content), vae.img_to_idxBl(style)),
        "encoders": lambda: (m.feat_emb(m.content_encoder(content).squeeze(-1).squeeze(-1)),
                             m.feat_emb(m.style_encoder(style).squeeze(-1).squeeze(-1))),
        "decode": lambda: vae.fhat_to_img(f_hat),
        "total": lambda: reference_generate(bundle, content, style, seed=0),
    }
