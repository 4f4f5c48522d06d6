"""KV-cache eviction scorers (kvpress wrappers) chosen by ``EvictionConfig.scorer``."""

from timebill_ros import plugins
from timebill_ros.config import EvictionConfig
from timebill_ros.engine.eviction.base import (EvictionScorer, gather_positions, keep_indices,
                                               n_keep_for, windowed)
from timebill_ros.engine.eviction.knorm import KnormScorer
from timebill_ros.engine.eviction.snapkv import SnapKVScorer
from timebill_ros.engine.eviction.streaming_llm import StreamingLLMScorer

# The registry: the classes named in plugins.NAMES['eviction scorer'], in its order.
SCORERS = plugins.load('eviction scorer', EvictionScorer)

__all__ = ['EvictionScorer', 'KnormScorer', 'SnapKVScorer', 'StreamingLLMScorer', 'SCORERS',
           'gather_positions', 'keep_indices', 'make_scorer', 'n_keep_for', 'windowed']


def make_scorer(eviction_config: EvictionConfig) -> EvictionScorer:
    """Return the scorer named by ``eviction_config.scorer``."""
    if not isinstance(eviction_config, EvictionConfig):
        raise TypeError(f'eviction_config must be an EvictionConfig, got {eviction_config!r}')
    return plugins.choose('eviction scorer', SCORERS, eviction_config.scorer).from_config(
        eviction_config)
