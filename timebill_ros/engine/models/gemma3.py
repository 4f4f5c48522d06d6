"""Gemma 3 (text): sandwich norms, q / k norms, tanh-GELU, scaled embeddings, sliding windows.

Five of every six layers attend over the last ``sliding_window`` tokens with RoPE base 10000;
every sixth is global with the file's ``rope.freq_base`` (llama.cpp's and transformers'
pattern). The file's norm weights already hold transformers' ``1 + weight`` (llama.cpp's
converter adds the one), so the shared RMSNorm multiplies by them as they are. Embeddings are
scaled by sqrt(hidden); attention by 1 / sqrt(head dim) unless the file says otherwise.
"""

import math

from timebill_ros.engine.models.base import common_spec, DecoderSpec

SLIDING_PATTERN = 6  # layer i is global when (i + 1) % 6 == 0
LOCAL_ROPE_BASE = 10000.0


def spec(gguf) -> DecoderSpec:
    """Return the decoder spec of a ``gemma3`` GGUF."""
    n_layers = int(gguf.require('block_count'))
    hidden = int(gguf.require('embedding_length'))
    window = int(gguf.arch_get('attention.sliding_window', 0) or 0)
    changes = dict(
        activation='gelu_tanh', qk_norm=True, post_norms=True, embed_scale=math.sqrt(hidden),
        sliding_window=window, rope_base_local=LOCAL_ROPE_BASE,
        sliding_layers=tuple((i + 1) % SLIDING_PATTERN != 0 for i in range(n_layers)))
    scale = gguf.arch_get('attention.scale')
    if scale:
        changes['attention_scale'] = float(scale)
    return common_spec(gguf, **changes)
