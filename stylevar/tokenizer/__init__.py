"""The multi-scale VQ-VAE tokenizer."""
from stylevar.tokenizer.quantizer import MultiScaleQuantizer
from stylevar.tokenizer.vqvae import MultiScaleVQVAE, VQVAEOutput

__all__ = ["MultiScaleVQVAE", "MultiScaleQuantizer", "VQVAEOutput"]
