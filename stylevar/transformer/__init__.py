"""The StyleVAR transformer."""
from stylevar.transformer.attention import BlendedAttention, KVCache
from stylevar.transformer.model import (Block, Condition, Generated, Guide, HeadModulation, Modulation, StyleBlend,
                                        StyleVAR)

__all__ = ["StyleVAR", "Block", "BlendedAttention", "KVCache", "Condition", "StyleBlend", "Generated", "Guide",
           "Modulation", "HeadModulation"]
