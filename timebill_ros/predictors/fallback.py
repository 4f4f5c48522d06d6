"""The conservative fallback: N^ = N_max."""

from timebill_ros.predictors.base import LengthPredictor


class FallbackPredictor(LengthPredictor):
    """Assumes every answer runs to N_max tokens: never under-estimates the length."""

    name = 'fallback'

    def predict(self, prompt, input_ids, n_max):
        """Return n_max."""
        return n_max
