"""StreamingLLM scorer: keep the first ``n_sink`` tokens (attention sinks) and the most recent."""

from kvpress import StreamingLLMPress

from timebill_ros.engine.eviction.base import EvictionScorer


class StreamingLLMScorer(EvictionScorer):
    """Wraps kvpress ``StreamingLLMPress.score``.

    That score is a 0/1 mask that depends on the compression ratio, so ``n_keep`` is turned
    into the ratio for which kvpress keeps exactly ``n_keep`` tokens (ones) and prunes the rest.
    When ``n_keep < window_size + n_sink`` the forced observation window (see
    ``keep_indices``) takes the place of some sinks.
    """

    name = 'streaming_llm'

    def __init__(self, n_sink: int = 4):
        """Keep ``n_sink`` first tokens (attention sinks)."""
        if not isinstance(n_sink, int) or n_sink < 0:
            raise ValueError(f'n_sink must be an int >= 0, got {n_sink!r}')
        self.n_sink = n_sink

    def score(self, module, hidden_states, keys, values, kwargs, n_keep=None):
        """Return 1 for the sinks and the last ``n_keep - n_sink`` tokens, else 0: (B, H, N)."""
        n_x = keys.shape[2]
        if n_x <= self.n_sink:
            raise ValueError(f'StreamingLLM needs more than n_sink={self.n_sink} tokens, '
                             f'got {n_x}')
        press = StreamingLLMPress(compression_ratio=self._ratio(n_x, n_keep), n_sink=self.n_sink)
        return press.score(module, hidden_states, keys, values, None, kwargs)

    @staticmethod
    def _ratio(n_x, n_keep):
        """Return the ratio r with int(n_x (1 - r)) == n_keep (kvpress's rounding)."""
        if n_keep is None or n_keep >= n_x:
            return 0.0
        if n_keep < 1:
            raise ValueError(f'n_keep must be >= 1, got {n_keep!r}')
        # +0.5 keeps int() from truncating n_keep - epsilon down to n_keep - 1.
        return 1.0 - (n_keep + 0.5) / n_x
