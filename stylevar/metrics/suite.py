"""`MetricSuite`: every requested metric, each model loaded once, batched on CPU or CUDA."""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from stylevar.metrics import definitions as defs
from stylevar.loaders import weights
from stylevar.metrics.structure import ssim, ssim_standard

IMAGE_SIZE = 256


def prepare(img_B3HW: torch.Tensor, name: str, size: int = IMAGE_SIZE) -> torch.Tensor:
    """Check an image batch (float, (B, 3, H, W), values in [0, 1]) and resize it to size x size."""
    if not isinstance(img_B3HW, torch.Tensor) or img_B3HW.ndim != 4 or img_B3HW.shape[1] != 3:
        shape = tuple(img_B3HW.shape) if isinstance(img_B3HW, torch.Tensor) else type(img_B3HW).__name__
        raise ValueError(f"{name}: expected a float tensor (B, 3, H, W), got {shape}")
    if not img_B3HW.is_floating_point():
        raise ValueError(f"{name}: expected float values in [0, 1], got dtype {img_B3HW.dtype}")
    lo, hi = float(img_B3HW.min()), float(img_B3HW.max())
    if lo < -1e-3 or hi > 1 + 1e-3:
        raise ValueError(f"{name}: values must lie in [0, 1], found [{lo:.3f}, {hi:.3f}]")
    x = img_B3HW.float().clamp(0, 1)
    if x.shape[-2:] != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True).clamp(0, 1)
    return x


class MetricSuite:
    """Compute several metrics on batches of (generated, content, style[, target]) images in [0, 1].

    With `target`, LPIPS / SSIM / DreamSim / CLIP compare to the target, else to the content. Images are resized
    to `image_size` first; models load on first use. With `allow_missing=True`, metrics whose weights are absent
    are left out (`skipped`: name -> `MissingWeightError`); otherwise construction raises the first."""

    def __init__(self, metrics: Sequence[str] = defs.PAPER_METRICS, *, device: str | torch.device | None = None,
                 lpips_net: str = "vgg", batch_size: int = 16, allow_missing: bool = False,
                 image_size: int = IMAGE_SIZE):
        self.requested = tuple(dict.fromkeys(defs.get(m).name for m in metrics))
        if not self.requested:
            raise ValueError("MetricSuite needs at least one metric")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.lpips_net, self.batch_size, self.image_size = lpips_net, batch_size, image_size
        self.skipped: dict[str, weights.MissingWeightError] = {}
        for name in self.requested:
            gone = weights.missing(defs.weights_for(name, lpips_net))
            if gone:
                if not allow_missing:
                    raise next(iter(gone.values()))
                self.skipped[name] = next(iter(gone.values()))
        self.metrics = tuple(m for m in self.requested if m not in self.skipped)
        self._models: dict[str, torch.nn.Module] = {}
        if any(defs.get(m).extra for m in self.metrics):  # without the extra: TeacherUnavailable, one line, now
            from stylevar.metrics.pretrained_style import StylePredictor

            self._models["style"] = StylePredictor().to(self.device)

    def _model(self, key: str) -> torch.nn.Module:
        if key not in self._models:
            from stylevar.metrics.perceptual import CLIPMetric, DreamSimMetric, LPIPSMetric
            from stylevar.metrics.vgg import VGGLosses

            if key == "vgg":
                model = VGGLosses.from_file()
            elif key == "lpips":
                model = LPIPSMetric.from_weights(self.lpips_net)
            elif key == "dreamsim":
                model = DreamSimMetric.from_weights(device=self.device)
            elif key == "clip":
                model = CLIPMetric.from_weights()
            else:
                raise KeyError(key)
            self._models[key] = model.to(self.device).eval()
        return self._models[key]

    def load(self) -> "MetricSuite":
        """Load every model now (otherwise on first use)."""
        keys = {"style_loss": "vgg", "content_loss": "vgg", "lpips": "lpips", "dreamsim": "dreamsim", "clip": "clip"}
        for name in self.metrics:
            if name in keys:
                self._model(keys[name])
        return self

    @torch.no_grad()
    def _batch(self, gen: torch.Tensor, content: torch.Tensor, style: torch.Tensor, ref: torch.Tensor) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        wanted = set(self.metrics)
        if wanted & {"style_loss", "content_loss"}:
            losses = self._model("vgg")(gen, content, style)
            out.update({k: v for k, v in losses.items() if k in wanted})
        if "lpips" in wanted:
            out["lpips"] = self._model("lpips")(gen, ref)
        if "ssim" in wanted:
            out["ssim"] = ssim(gen, ref)
        if "ssim_standard" in wanted:
            out["ssim_standard"] = ssim_standard(gen, ref)
        if "dreamsim" in wanted:
            out["dreamsim"] = self._model("dreamsim")(gen, ref)
        if "clip" in wanted:
            out["clip"] = self._model("clip")(gen, ref)
        out.update(self._style_batch(gen, content, style, wanted))
        return {k: v.detach().float().cpu() for k, v in out.items()}

    def _style_batch(self, gen: torch.Tensor, content: torch.Tensor, style: torch.Tensor, wanted: set[str]
                     ) -> dict[str, torch.Tensor]:
        """The pretrained style measures and sharpness (`stylevar.metrics.pretrained_style`)."""
        from stylevar.metrics.pretrained_style import compare, sharpness
        out = {}
        if wanted & {"style_cosine", "style_gram"}:
            pretrained = compare(self._models["style"](gen), self._models["style"](style))
            out["style_cosine"], out["style_gram"] = pretrained["cosine"], pretrained["gram"]
        if "sharpness" in wanted:
            out["sharpness"] = sharpness(gen, content)
        return {k: v for k, v in out.items() if k in wanted}

    def __call__(self, generated: torch.Tensor, content: torch.Tensor, style: torch.Tensor,
                 target: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """{metric: (B,) float32 CPU tensor} for the metrics in `self.metrics` (in that order)."""
        size = self.image_size
        gen = prepare(generated, "generated", size)
        c, s = prepare(content, "content", size), prepare(style, "style", size)
        t = prepare(target, "target", size) if target is not None else None
        b = gen.shape[0]
        for name, x in (("content", c), ("style", s), ("target", t)):
            if x is not None and x.shape[0] != b:
                raise ValueError(f"{name} has batch size {x.shape[0]}, generated has {b}")
        ref = t if t is not None else c
        chunks: dict[str, list[torch.Tensor]] = {m: [] for m in self.metrics}
        for i in range(0, b, self.batch_size):
            sl = slice(i, i + self.batch_size)
            res = self._batch(*(x[sl].to(self.device) for x in (gen, c, s, ref)))
            for m in self.metrics:
                chunks[m].append(res[m])
        return {m: torch.cat(chunks[m]) for m in self.metrics}


def compute(name: str, generated: torch.Tensor, content: torch.Tensor, style: torch.Tensor,
            target: torch.Tensor | None = None, *, device: str | torch.device | None = None,
            lpips_net: str = "vgg") -> torch.Tensor:
    """One metric per image: (B,). With `target` the pairwise metrics compare to it, else to `content`."""
    suite = MetricSuite((name,), device=device, lpips_net=lpips_net)
    return suite(generated, content, style, target)[name]
