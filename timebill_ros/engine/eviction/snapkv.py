"""SnapKV scorer: attention of the observation-window queries over the prompt keys."""

import torch
from kvpress import SnapKVPress

from timebill_ros.engine.eviction.base import EvictionScorer


class SnapKVScorer(EvictionScorer):
    """Wraps kvpress ``SnapKVPress.score``.

    It needs the attention input (hidden states) of more than ``window_size`` last prompt
    positions and their ``position_embeddings`` (cos, sin) in ``kwargs``.
    """

    name = 'snapkv'

    def __init__(self, window_size: int):
        """Build the kvpress press; window_size in tokens."""
        self.press = SnapKVPress(window_size=window_size)

    @classmethod
    def from_config(cls, eviction_config):
        """Return the scorer with ``eviction.window_size``."""
        return cls(window_size=eviction_config.window_size)

    def score(self, module, hidden_states, keys, values, kwargs, n_keep=None):
        """Return kvpress SnapKV scores, (B, H, N); the window gets the top score."""
        window = self.press.window_size
        if hidden_states.shape[1] <= window or keys.shape[2] <= window:
            raise ValueError(
                f'SnapKV needs more than window_size={window} positions, got hidden_states '
                f'{tuple(hidden_states.shape)} and keys {tuple(keys.shape)}')
        # inference_mode: the cache tensors are inference tensors (made under inference_mode),
        # which autograd may not record through q_proj's weights.
        with torch.inference_mode():
            return self.press.score(module, hidden_states, keys, values, None, kwargs)
