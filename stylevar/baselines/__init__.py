"""Baselines evaluated beside StyleVAR: AdaIN, Reinhard colour transfer (`stylevar.baselines.reinhard`) and
Magenta's arbitrary stylization (`MagentaStylizer`; onnxruntime is imported only when one is built)."""
from stylevar.baselines.adain import AdaIN
from stylevar.baselines.magenta import MagentaConfig, MagentaStylizer, TeacherUnavailable, magenta_available

__all__ = ["AdaIN", "MagentaConfig", "MagentaStylizer", "TeacherUnavailable", "magenta_available"]
