"""The StyleVAR transformer."""
from stylevar.transformer.attention import BlendedAttention, KVCache
from stylevar.transformer.block import Block, Guide, HeadModulation, Modulation
from stylevar.transformer.condition import Condition, StyleBlend
from stylevar.transformer.model import Generated, StyleVAR

__all__ = ["StyleVAR", "Block", "BlendedAttention", "KVCache", "Condition", "StyleBlend", "Generated", "Guide",
           "Modulation", "HeadModulation"]
