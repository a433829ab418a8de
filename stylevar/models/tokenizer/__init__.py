"""The multi-scale VQ-VAE tokenizer."""
from stylevar.models.tokenizer.quantizer import MultiScaleQuantizer
from stylevar.models.tokenizer.vqvae import MultiScaleVQVAE, VQVAEOutput

__all__ = ["MultiScaleVQVAE", "MultiScaleQuantizer", "VQVAEOutput"]
