"""Qwen2 / Qwen2.5: Llama's layer with biases on the query, key and value projections.

RoPE in rotate-half order already (no row reordering); the biases are read where the file
has them (``attn_q.bias``...).
"""

from timebill_ros.engine.models.base import common_spec, DecoderSpec


def spec(gguf) -> DecoderSpec:
    """Return the decoder spec of a ``qwen2`` GGUF."""
    return common_spec(gguf)
