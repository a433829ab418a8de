"""Evaluation metrics of the StyleVAR paper: style / content loss (VGG-19), LPIPS, SSIM, DreamSim, CLIP.

Images are float tensors (B, 3, H, W) in [0, 1], resized to 256 x 256. `compute` loads the model it needs on every
call; `MetricSuite` loads each once for many batches.
"""
from __future__ import annotations

__all__ = ["MetricSuite", "compute"]


def __getattr__(name):  # the suite pulls in torch; `stylevar.metrics.definitions` must not
    if name in __all__:
        from stylevar.metrics import suite

        return getattr(suite, name)
    raise AttributeError(f"module 'stylevar.metrics' has no attribute {name!r}")
