"""The StyleVAR transformer."""
from stylevar.transformer.attention import BlendedAttention, KVCache
from stylevar.transformer.model import Block, Condition, StyleBlend, StyleVAR

__all__ = ["StyleVAR", "Block", "BlendedAttention", "KVCache", "Condition", "StyleBlend"]
