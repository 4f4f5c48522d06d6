"""Llama family (Llama 2 / 3.x, SmolLM2, TinyLlama, Mistral without sliding window).

The file's query / key rows are in llama.cpp's interleaved RoPE order; they are reordered at
load into the rotate-half order (as transformers does). Llama 3.x's ``rope_freqs.weight``
divides the inverse frequencies (common_spec).
"""

from timebill_ros.engine.models.base import common_spec, DecoderSpec


def spec(gguf) -> DecoderSpec:
    """Return the decoder spec of a ``llama`` GGUF."""
    return common_spec(gguf, permute_qk=True)
