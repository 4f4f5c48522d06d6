"""Baseline: the same length for every prompt, the train set's mean (the floor to beat)."""

from typing import Sequence

import numpy as np

from timebill_ros.training.heads.base import LengthModel, true_lengths
from timebill_ros.training.heads.checks import input_arrays


class ConstantMean(LengthModel):
    """Predicts the mean train length (tokens, capped at N_model) for every prompt.

    Issue 14's yardstick: a predictor is only useful where it beats this by a wide margin.
    ``val`` is not used.
    """

    name = 'constant mean'

    def __init__(self):
        self.mean_tokens = None

    def fit(self, train: Sequence, val: Sequence = ()) -> None:
        """Take the mean of ``train``'s lengths; raise ValueError if it is empty."""
        if not train:
            raise ValueError('train must hold at least one example, got none')
        self.mean_tokens = float(true_lengths(train).mean())

    def predict_tokens(self, examples: Sequence) -> np.ndarray:
        """Return the train mean for each example, clipped to its N_model, tokens."""
        if self.mean_tokens is None:
            raise RuntimeError(f'{self.name}: call fit() before predict_tokens()')
        _, n_model = input_arrays(examples, 'examples')
        return np.minimum(self.mean_tokens, n_model)
