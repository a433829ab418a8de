"""StyleVAR: reference-based image style transfer with a Visual Autoregressive model.

The public surface: `StylePipeline` (imported on first use), the model configurations and their presets.
"""
from stylevar.config import StyleVARConfig, VQVAEConfig, presets

__version__ = "0.1.0"
__all__ = ["StyleVARConfig", "VQVAEConfig", "StyleMix", "StylePipeline", "StylizeRequest", "presets", "__version__"]


def __getattr__(name):  # the pipeline pulls in torch models: import it on first use
    if name == "StylePipeline":
        from stylevar.pipelines.pipeline import StylePipeline

        return StylePipeline
    if name in ("StyleMix", "StylizeRequest"):
        from stylevar.pipelines import request

        return getattr(request, name)
    raise AttributeError(f"module 'stylevar' has no attribute {name!r}")
