"""Base class of response-length predictors."""

import abc
from typing import Sequence


class LengthPredictor(abc.ABC):
    """Predicts N^, the response length in tokens, before decoding starts.

    The server runs :meth:`predict` on a CPU thread while the prefill runs.
    """

    name = 'base'

    @abc.abstractmethod
    def predict(self, prompt: str, input_ids: Sequence[int], n_max: int) -> int:
        """Return N^ in tokens, 0 <= N^ <= n_max (Eq. 2 post-processing included)."""
