"""Key-norm scorer: keys with a small L2 norm are kept."""

from kvpress import KnormPress

from timebill_ros.engine.eviction.base import EvictionScorer


class KnormScorer(EvictionScorer):
    """Wraps kvpress ``KnormPress.score`` (minus the key L2 norm)."""

    name = 'knorm'

    def __init__(self):
        """Build the kvpress press."""
        self.press = KnormPress()

    def score(self, module, hidden_states, keys, values, kwargs, n_keep=None):
        """Return -||k||, (B, H, N)."""
        return self.press.score(module, hidden_states, keys, values, None, kwargs)
