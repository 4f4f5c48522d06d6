"""KV-cache eviction scorers (kvpress wrappers) chosen by ``EvictionConfig.scorer``."""

from timebill_ros.config import EvictionConfig
from timebill_ros.engine.eviction.base import (EvictionScorer, gather_positions, keep_indices,
                                               n_keep_for)
from timebill_ros.engine.eviction.knorm import KnormScorer
from timebill_ros.engine.eviction.snapkv import SnapKVScorer
from timebill_ros.engine.eviction.streaming_llm import StreamingLLMScorer

__all__ = ['EvictionScorer', 'KnormScorer', 'SnapKVScorer', 'StreamingLLMScorer',
           'gather_positions', 'keep_indices', 'make_scorer', 'n_keep_for']


def make_scorer(eviction_config: EvictionConfig) -> EvictionScorer:
    """Return the scorer named by ``eviction_config.scorer``."""
    if not isinstance(eviction_config, EvictionConfig):
        raise TypeError(f'eviction_config must be an EvictionConfig, got {eviction_config!r}')
    name = eviction_config.scorer
    if name == 'snapkv':
        return SnapKVScorer(window_size=eviction_config.window_size)
    if name == 'streaming_llm':
        return StreamingLLMScorer()
    if name == 'knorm':
        return KnormScorer()
    raise ValueError(f'unknown eviction scorer {name!r}')
