"""The LLM engine: prefill / evict / decode over a forward pass and its KV cache."""

from timebill_ros.engine.llm_engine import (DEFAULT_THREADS, DTYPES, DecodeResult,
                                            GenerationStopped, LlmEngine, PrefillState,
                                            fixed_chunks, make_forward)

__all__ = ['DEFAULT_THREADS', 'DTYPES', 'DecodeResult', 'GenerationStopped', 'LlmEngine',
           'PrefillState', 'fixed_chunks', 'make_forward']
