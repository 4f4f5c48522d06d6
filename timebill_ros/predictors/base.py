"""Base class of response-length predictors."""

import abc
from typing import Sequence


class LengthPredictor(abc.ABC):
    """Predicts N^, the response length in tokens, before decoding starts.

    The server runs :meth:`predict` on a CPU thread while the prefill runs.
    """

    name = 'base'

    @classmethod
    def from_config(cls, predictor_config, model_key='', prefill_s=None, cache_dir=None,
                    log=print):
        """Return the predictor ``predictor.kind`` names, built from the config (the registry).

        predictor_config: config.PredictorConfig. model_key: the served model's (a file
        trained for another is refused). prefill_s: N_x tokens -> seconds (Eq. 4a).
        cache_dir: where built predictors live (None: the default). Raises when the
        predictor cannot be built; make_predictor then serves the fallback.
        """
        return cls()

    @abc.abstractmethod
    def predict(self, prompt: str, input_ids: Sequence[int], n_max: int) -> int:
        """Return N^ in tokens, 0 <= N^ <= n_max (Eq. 2 post-processing included)."""

    def predict_bounds(self, prompt: str, input_ids: Sequence[int], n_max: int,
                       q: float) -> tuple:
        """Return (N^, N^_q), tokens: :meth:`predict` and the ``q`` quantile of the length.

        N^_q (0 <= N^_q <= n_max) is None for a predictor without a length distribution (the
        default); the budget then falls back to TimeBill's k N^.
        """
        return self.predict(prompt, input_ids, n_max), None

    def expected_time_s(self, n_x: int) -> float:
        """Return the calibrated t^_Predict for a prompt of ``n_x`` tokens, seconds."""
        return 0.0

    def abort(self) -> None:
        """Ask a :meth:`predict` call in flight (another thread) to give up soon.

        The server calls it when the goal the prediction is for has ended; the call may then
        raise. Predictors that cannot be interrupted ignore it.
        """
