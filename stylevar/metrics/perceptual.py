"""Learned perceptual metrics: LPIPS (VGG-16 or AlexNet), DreamSim (dino_vitb16) and CLIP similarity (ViT-B-32),
each a value per pair (B,). Every loader resolves its files through `stylevar.loaders.weights` and checks them.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Iterator, Literal

import torch
import torch.nn.functional as F
from torch import nn

from stylevar.loaders import weights
from stylevar.models.state_dict import WeightMismatchError, read_checked

LpipsNet = Literal["vgg", "alex"]
LPIPS_WEIGHTS = {"vgg": "vgg16", "alex": "alexnet"}
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
DREAMSIM_TYPE = "dino_vitb16"
DREAMSIM_SIZE = 224
CLIP_SIZE = 224


class _NetworkMetric(nn.Module):
    """A metric computed by one network, `model`."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model


class LPIPSMetric(_NetworkMetric):
    @classmethod
    def from_weights(cls, net: LpipsNet = "vgg", backbone: str | os.PathLike | None = None) -> "LPIPSMetric":
        """LPIPS with the ImageNet backbone read from the torchvision file (`vgg16` or `alexnet`)."""
        import lpips
        from torchvision import models
        if net not in LPIPS_WEIGHTS:
            raise ValueError(f"LPIPS backbone must be one of {tuple(LPIPS_WEIGHTS)}, not {net!r}")
        path = weights.resolve(LPIPS_WEIGHTS[net]) if backbone is None else Path(backbone)
        with torch.device("meta"):
            skeleton = models.vgg16() if net == "vgg" else models.alexnet()
        sd = read_checked(path, skeleton.state_dict(), source=f"{path} (torchvision {skeleton.__class__.__name__})")
        with warnings.catch_warnings():  # lpips passes the deprecated `pretrained=` to torchvision
            warnings.simplefilter("ignore", UserWarning)
            model = lpips.LPIPS(net=net, pretrained=True, pnet_rand=True, verbose=False)
        # lpips splits torchvision's `features` into slices that keep the feature index as module name
        trunk = {}
        for slice_name, block in model.net.named_children():
            for idx, _ in block.named_children():
                for param in ("weight", "bias"):
                    key = f"features.{idx}.{param}"
                    if key in sd:
                        trunk[f"{slice_name}.{idx}.{param}"] = sd[key]
        model.net.load_state_dict(trunk, strict=True)
        return cls(model.eval().requires_grad_(False))

    @torch.no_grad()
    def forward(self, a_B3HW: torch.Tensor, b_B3HW: torch.Tensor) -> torch.Tensor:
        return self.model(a_B3HW * 2 - 1, b_B3HW * 2 - 1).reshape(-1)


@contextlib.contextmanager
def _isolated_torch_hub(hub_dir: Path) -> Iterator[None]:
    """Point torch.hub at `hub_dir` for the duration, then restore it and drop the modules it imported."""
    # torch.hub.set_dir cannot restore "unset" (which follows $TORCH_HOME), so the saved private value is put back
    saved_dir = getattr(torch.hub, "_hub_dir", None)
    before = set(sys.modules)
    torch.hub.set_dir(str(hub_dir))
    try:
        yield
    finally:
        torch.hub._hub_dir = saved_dir  # type: ignore[attr-defined]
        root = hub_dir.resolve()
        for name in set(sys.modules) - before:
            file = getattr(sys.modules[name], "__file__", None)
            if file and root in Path(file).resolve().parents:
                del sys.modules[name]


def _check_dreamsim_tree(folder: Path) -> None:
    """Check the DINO ViT-B/16 backbone and the DINO head against dreamsim's own ViT definition."""
    from dreamsim.feature_extraction.vision_transformer import DINOHead, vit_base
    vit = vit_base(patch_size=16, num_classes=0)  # ~0.3 s on CPU; its init cannot run on the meta device
    with warnings.catch_warnings():  # DINOHead uses the deprecated nn.utils.weight_norm
        warnings.simplefilter("ignore", FutureWarning)
        head = DINOHead(768, 2048)
    backbone = folder / "checkpoints" / "dino_vitbase16_pretrain.pth"
    read_checked(backbone, vit.state_dict(), source=f"{backbone} (DINO ViT-B/16)")
    pretrain = folder / "dino_vitb16_pretrain.pth"
    source = f"{pretrain} (DreamSim DINO head, sd['student'])"
    expected = {f"module.head.{k}": v for k, v in head.state_dict().items() if not k.startswith("last_layer.")}
    student = read_checked(pretrain, expected, source=source, key="student", allow_unexpected=True)
    if "module.head.last_layer.weight" not in student:
        raise WeightMismatchError(source, ["module.head.last_layer.weight"], [], [])


class DreamSimMetric(_NetworkMetric):
    @classmethod
    def from_weights(cls, folder: str | os.PathLike | None = None, device: str | torch.device = "cpu") -> "DreamSimMetric":
        from dreamsim import dreamsim
        folder = weights.resolve("dreamsim") if folder is None else Path(folder)
        _check_dreamsim_tree(folder)
        with _isolated_torch_hub(folder), contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
            # dreamsim's own DINOHead (deprecated weight_norm) and its double peft wrapping warn on every load
            warnings.simplefilter("ignore", FutureWarning)
            warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute")
            model, _ = dreamsim(pretrained=True, device=str(device), cache_dir=str(folder), dreamsim_type=DREAMSIM_TYPE)
        return cls(model.eval().requires_grad_(False))

    @torch.no_grad()
    def forward(self, a_B3HW: torch.Tensor, b_B3HW: torch.Tensor) -> torch.Tensor:
        a, b = (F.interpolate(x, size=(DREAMSIM_SIZE,) * 2, mode="bilinear", align_corners=False)
                for x in (a_B3HW, b_B3HW))
        return self.model(a, b).reshape(-1)


class _DropLogMessage(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


class CLIPMetric(_NetworkMetric):
    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.register_buffer("mean", torch.tensor(CLIP_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(CLIP_STD).view(1, 3, 1, 1), persistent=False)

    @classmethod
    def from_weights(cls, path: str | os.PathLike | None = None) -> "CLIPMetric":
        import open_clip
        path = weights.resolve("clip") if path is None else Path(path)
        # built empty, checked, then filled: silence open_clip's "initialized randomly" warning meanwhile
        quiet = _DropLogMessage("No pretrained weights loaded")
        logging.getLogger().addFilter(quiet)
        try:
            model = open_clip.create_model("ViT-B-32", pretrained=None, force_quick_gelu=True)
        finally:
            logging.getLogger().removeFilter(quiet)
        read_checked(path, model.state_dict(), source=f"{path} (open_clip ViT-B-32)")
        open_clip.load_checkpoint(model, str(path))
        return cls(model.eval().requires_grad_(False))

    def embed(self, img_B3HW: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(img_B3HW, size=(CLIP_SIZE, CLIP_SIZE), mode="bicubic", align_corners=False, antialias=True)
        return self.model.encode_image((x.clamp(0, 1) - self.mean) / self.std)

    @torch.no_grad()
    def forward(self, a_B3HW: torch.Tensor, b_B3HW: torch.Tensor) -> torch.Tensor:
        return F.cosine_similarity(self.embed(a_B3HW), self.embed(b_B3HW), dim=-1)
