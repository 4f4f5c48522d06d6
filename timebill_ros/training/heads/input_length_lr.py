"""Baseline: linear regression of the response length on the prompt length (tokens)."""

from typing import Sequence

import numpy as np
from scipy import stats

from timebill_ros.training.heads.base import LengthModel
from timebill_ros.training.heads.checks import input_arrays, label_arrays


class InputLengthLR(LengthModel):
    """n_tokens ~ slope * n_prompt_tokens + intercept, fitted by ``scipy.stats.linregress``.

    Both lengths are in tokens (n_prompt_tokens is the chat-formatted prompt). Predictions are
    clipped to [1, n_model] of each example. ``val`` is not used (nothing to stop early).
    """

    name = 'input-length LR'

    def __init__(self):
        self.slope = None  # tokens of answer per token of prompt
        self.intercept = None  # tokens
        self.rvalue = None  # Pearson r on the train set

    def fit(self, train: Sequence, val: Sequence = ()) -> None:
        """Fit on ``train``; raise ValueError if it has < 2 examples or one prompt length."""
        n_tokens, n_prompt, _ = label_arrays(train, 'train')
        distinct = sorted({int(x) for x in n_prompt})
        if len(distinct) < 2:
            raise ValueError(f'train needs >= 2 distinct n_prompt_tokens, got {n_tokens.size} '
                             f'example(s) with n_prompt_tokens {distinct}')
        res = stats.linregress(n_prompt, n_tokens)
        self.slope, self.intercept, self.rvalue = (
            float(res.slope), float(res.intercept), float(res.rvalue))

    def predict_tokens(self, examples: Sequence) -> np.ndarray:
        """Return predicted lengths in tokens, clipped to [1, n_model], shape (len(examples),)."""
        if self.slope is None:
            raise RuntimeError(f'{self.name}: call fit() before predict_tokens()')
        n_prompt, n_model = input_arrays(examples, 'examples')
        return np.clip(self.slope * n_prompt + self.intercept, 1.0, n_model)
