"""The baselines beside StyleVAR's result, run in the UI's own process: Magenta (`stylevar.baselines.magenta`,
the `teacher` extra; the default when installed) and AdaIN (`stylevar.baselines.adain` with its two registered
weights). Each `status()` only looks for what its baseline needs and says, in one line, what is missing.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

from PIL import Image

WEIGHTS = ("adain_vgg", "adain_decoder")


@dataclass(frozen=True)
class BaselineStatus:
    available: bool
    reason: str  # why the baseline is off, or which files it runs with


class Baseline(Protocol):
    """A method the UI runs beside StyleVAR on the same two files."""

    name: str  # the panel's choice, e.g. "magenta"
    label: str  # shown in the panel, e.g. "Magenta"

    def status(self) -> BaselineStatus: ...

    def stylize(self, content_path: str, style_path: str, alpha: float = 1.0) -> Image.Image:
        """The result at the content's aspect ratio; `alpha` in [0, 1] is the strength (1: the style's fully)."""
        ...


@dataclass(frozen=True)
class DecodeLimits:
    max_side: int = 512  # inputs decoded downscaled to this long side
    max_pixels: int = 40_000_000  # inputs larger than this are refused before decoding
    max_whole_pixels: int = 4_194_304  # the same for images that can only be decoded at full size (WebP, ...)


@dataclass(frozen=True)
class AdaINConfig(DecodeLimits):
    device: str = "cpu"  # AdaIN runs at the content's size, its long side capped at `max_side`


class AdaINBaseline:
    """Loads AdaIN once, on first use; `status()` only looks for the module and the files."""

    name = "adain"
    label = "AdaIN"

    def __init__(self, config: AdaINConfig = AdaINConfig()):
        self.config = config
        self._model: Any = None
        self._lock = threading.Lock()

    def status(self) -> BaselineStatus:
        try:
            from stylevar.baselines import adain  # noqa: F401
        except ImportError as e:
            return BaselineStatus(False, f"the AdaIN baseline is not installed (`stylevar.baselines.adain`: {e})")
        from stylevar.loaders import weights
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
        import torch
        from stylevar.processing.images import pil_to_tensor, tensor_to_pil
        cfg = self.config
        content, style = (_cap(decoded(path, cfg), cfg.max_side) for path in (content_path, style_path))
        model = self._load()
        device = torch.device(self.config.device)
        with torch.inference_mode():  # AdaIN.stylize: (B, 3, H, W) in [0, 1] -> same
            out_13HW = model.stylize(pil_to_tensor(content)[None].to(device), pil_to_tensor(style)[None].to(device),
                                     alpha=float(alpha))
        out = tensor_to_pil(out_13HW[0].float().cpu())
        return out if out.size == content.size else out.resize(content.size, Image.BICUBIC)


@dataclass(frozen=True)
class MagentaBaselineConfig(DecodeLimits):
    threads: int = 1  # onnxruntime intra-op threads (the network draws at 384 px)


class MagentaBaseline:
    """Builds the Magenta stylizer once, on first use; `status()` only looks for the packages."""

    name = "magenta"
    label = "Magenta"

    def __init__(self, config: MagentaBaselineConfig = MagentaBaselineConfig()):
        self.config = config
        self._stylizer: Any = None
        self._lock = threading.Lock()

    def status(self) -> BaselineStatus:
        from stylevar.baselines.magenta import ATTRIBUTION, TeacherUnavailable, models_dir
        try:
            models_dir()
        except TeacherUnavailable as e:  # the one line naming the extra
            return BaselineStatus(False, str(e))
        return BaselineStatus(True, f"{ATTRIBUTION}, on onnxruntime (CPU): content at 384 px on its longer side, "
                                    "style as a 256 px centre square.")

    def _load(self) -> Any:
        with self._lock:
            if self._stylizer is None:
                from stylevar.baselines.magenta import MagentaConfig, MagentaStylizer

                self._stylizer = MagentaStylizer(MagentaConfig(threads=self.config.threads))
            return self._stylizer

    def stylize(self, content_path: str, style_path: str, alpha: float = 1.0) -> Image.Image:
        """`alpha` moves the style vector from the content's own (0) to the style's (1)."""
        content, style = (decoded(path, self.config) for path in (content_path, style_path))
        return self._load()(content, style, strength=min(max(float(alpha), 0.0), 1.0))


def decoded(path: str, cfg: DecodeLimits) -> Image.Image:
    """An input file as RGB, decoded downscaled to `cfg.max_side` within the config's pixel limits."""
    from stylevar.processing.images import ACCEPTED_FORMATS, load_image
    return load_image(path, max_pixels=cfg.max_pixels, formats=ACCEPTED_FORMATS, max_side=cfg.max_side,
                      max_whole_pixels=cfg.max_whole_pixels)


def default_baselines() -> tuple[Baseline, ...]:
    return MagentaBaseline(), AdaINBaseline()


def _cap(img: Image.Image, max_side: int) -> Image.Image:
    """Long side at most `max_side`, both sides multiples of 8 (the decoder upsamples by 8)."""
    w, h = img.size
    s = min(1.0, max_side / max(w, h))
    size = (max(8, round(w * s / 8) * 8), max(8, round(h * s / 8) * 8))
    return img if size == img.size else img.resize(size, Image.BICUBIC)
