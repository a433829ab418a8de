"""The StyleVAR transformer."""
from stylevar.models.transformer.attention import BlendedAttention, KVCache
from stylevar.models.transformer.block import Block, Guide, HeadModulation, Modulation
from stylevar.models.transformer.condition import Condition, StyleBlend
from stylevar.models.transformer.model import Generated, StyleVAR

__all__ = ["StyleVAR", "Block", "BlendedAttention", "KVCache", "Condition", "StyleBlend", "Generated", "Guide",
           "Modulation", "HeadModulation"]
