"""Qwen3: Qwen2's layer without biases, with per-head RMSNorm of queries and keys."""

from timebill_ros.engine.models.base import common_spec, DecoderSpec


def spec(gguf) -> DecoderSpec:
    """Return the decoder spec of a ``qwen3`` GGUF."""
    return common_spec(gguf, qk_norm=True)
