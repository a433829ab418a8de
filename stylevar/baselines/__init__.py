"""Baselines evaluated beside StyleVAR."""
from stylevar.baselines.adain import AdaIN

__all__ = ["AdaIN"]
