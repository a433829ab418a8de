"""The AdaIN baseline beside StyleVAR's result, run in the UI's own process.

It needs `stylevar.baselines.adain` and two registered weights, `adain_vgg` (vgg_normalised.pth) and
`adain_decoder` (decoder.pth), found through `stylevar.weights` (nothing is downloaded). When either is
missing the UI shows the reason and keeps the AdaIN panel disabled.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from PIL import Image

WEIGHTS = ("adain_vgg", "adain_decoder")


@dataclass(frozen=True)
class BaselineStatus:
    available: bool
    reason: str  # why the baseline is off, or which files it runs with


@dataclass(frozen=True)
class AdaINConfig:
    device: str = "cpu"
    max_side: int = 512  # AdaIN runs at the content's size, its long side capped here (decoded downscaled)
    max_pixels: int = 40_000_000  # inputs larger than this are refused before decoding
    max_whole_pixels: int = 4_194_304  # the same for images that can only be decoded at full size (WebP, ...)


class AdaINBaseline:
    """Loads AdaIN once, on first use; `status()` only looks for the module and the files."""

    def __init__(self, config: AdaINConfig = AdaINConfig()):
        self.config = config
        self._model: Any = None
        self._lock = threading.Lock()

    def status(self) -> BaselineStatus:
        try:
            from stylevar.baselines import adain  # noqa: F401
        except ImportError as e:
            return BaselineStatus(False, f"the AdaIN baseline is not installed (`stylevar.baselines.adain`: {e})")
        from stylevar import weights

        absent = weights.missing(WEIGHTS)
        if absent:
            files = ", ".join(f"`{weights.get(n).filename}`" for n in absent)
            paths = "; ".join(f"`{weights.get(n).search_paths()[-1]}`" for n in absent)
            fetch = " ".join(absent)
            return BaselineStatus(False, f"AdaIN weights missing: {files} (looked for at {paths}). "
                                         f"Fetch them with `stylevar weights fetch {fetch}`, then restart the UI.")
        paths = ", ".join(f"`{weights.resolve(n)}`" for n in WEIGHTS)
        return BaselineStatus(True, f"AdaIN (VGG-19 relu4_1 encoder + decoder) from {paths}, "
                                    f"run on {self.config.device}.")

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                from stylevar.baselines.adain import AdaIN

                self._model = AdaIN.from_registry("vgg_normalised").to(self.config.device)
            return self._model

    def stylize(self, content_path: str, style_path: str, alpha: float = 1.0) -> Image.Image:
        """Content and style image files -> the AdaIN result, at the content's aspect ratio."""
        import torch

        from stylevar.images import ACCEPTED_FORMATS, load_image, pil_to_tensor, tensor_to_pil

        cfg = self.config
        content, style = (
            _cap(load_image(path, max_pixels=cfg.max_pixels, formats=ACCEPTED_FORMATS, max_side=cfg.max_side,
                            max_whole_pixels=cfg.max_whole_pixels), cfg.max_side)
            for path in (content_path, style_path))
        model = self._load()
        device = torch.device(self.config.device)
        with torch.inference_mode():  # AdaIN.stylize: (B, 3, H, W) in [0, 1] -> same
            out_13HW = model.stylize(pil_to_tensor(content)[None].to(device), pil_to_tensor(style)[None].to(device),
                                     alpha=float(alpha))
        out = tensor_to_pil(out_13HW[0].float().cpu())
        return out if out.size == content.size else out.resize(content.size, Image.BICUBIC)


def _cap(img: Image.Image, max_side: int) -> Image.Image:
    """Long side at most `max_side`, both sides multiples of 8 (the decoder upsamples by 8)."""
    w, h = img.size
    s = min(1.0, max_side / max(w, h))
    size = (max(8, round(w * s / 8) * 8), max(8, round(h * s / 8) * 8))
    return img if size == img.size else img.resize(size, Image.BICUBIC)
