"""Base class of the offline response-length models compared in ``timebill predictor eval``."""

import abc
import pathlib
from typing import List, Sequence

import numpy as np

from timebill_ros.training.metrics import length_metrics


def true_lengths(examples: Sequence) -> np.ndarray:
    """Return each example's length capped at its N_model (a capped answer counts as N_model)."""
    return np.array([min(e.n_tokens, e.n_model) for e in examples], dtype=np.float64)


def bucket_of(n_tokens: int, bucket_tokens: int) -> int:
    """Return the 0-based bucket index of a length: ceil(n / B) - 1 (Eq. 2's n^ minus one)."""
    if n_tokens < 1:
        raise ValueError(f'n_tokens must be >= 1, got {n_tokens!r}')
    return (int(n_tokens) + bucket_tokens - 1) // bucket_tokens - 1


def bucket_length(bucket: int, bucket_tokens: int) -> int:
    """Return the length a 0-based bucket reports: its upper edge n^ B (Eq. 2)."""
    return (int(bucket) + 1) * bucket_tokens


class LengthModel(abc.ABC):
    """A response-length model trained on the corpus; predicts tokens (not yet capped by N_max).

    Subclasses set ``name`` and implement :meth:`fit` and :meth:`predict_tokens`;
    :meth:`save` / :meth:`load` are optional (the report trains them in one run).
    """

    name = 'base'

    @abc.abstractmethod
    def fit(self, train: Sequence, val: Sequence) -> None:
        """Train on ``train`` (training.dataset.Example); ``val`` only for early stopping."""

    @abc.abstractmethod
    def predict_tokens(self, examples: Sequence) -> np.ndarray:
        """Return predicted response lengths in tokens, shape (len(examples),)."""

    def mae(self, examples: Sequence) -> float:
        """Return the mean absolute error of :meth:`predict_tokens` on ``examples``, tokens."""
        return length_metrics(true_lengths(examples), self.predict_tokens(examples))['mae']

    def save(self, folder: pathlib.Path) -> List[pathlib.Path]:
        """Write the trained model under ``folder``; return the files written."""
        raise NotImplementedError(f'{self.name} has no save()')
