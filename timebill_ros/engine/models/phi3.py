"""Phi-3 / Phi-3.5 mini: fused q, k, v (``attn_qkv``) and gate, up (``ffn_up``) tensors.

RoPE is in rotate-half order.

Not served: the long-context variants' per-frequency factors (``rope_factors_long`` /
``_short``) and Phi-3's sliding window; a file that has them is refused.
"""

from timebill_ros.engine.models.base import common_spec, DecoderSpec


def spec(gguf) -> DecoderSpec:
    """Return the decoder spec of a ``phi3`` GGUF."""
    for name in ('rope_factors_long.weight', 'rope_factors_short.weight'):
        if gguf.has(name):
            raise ValueError(f'{gguf.path.name}: {name} (long-context RoPE) is not supported')
    return common_spec(gguf, fused_qkv=True, fused_gate_up=True)
