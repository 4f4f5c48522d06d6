"""One length-predictor call timed on the service's clock (N^ and N^_q, tokens)."""

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One predictor call: N^ and N^_q (None: not asked or not known), tokens; its times, s."""

    n_hat: int
    n_upper: Optional[int]
    start_s: float
    end_s: float


def timed_predict(predictor, prompt, input_ids, n_max, clock, upper_quantile=0.0):
    """Return the :class:`Prediction` of one predictor call, service-clock seconds.

    upper_quantile: q > 0 also asks for N^_q (``budget.upper_quantile``), from the same run.
    """
    start = clock()
    if upper_quantile > 0:
        n_hat, n_upper = predictor.predict_bounds(prompt, input_ids, n_max, upper_quantile)
    else:
        n_hat, n_upper = predictor.predict(prompt, input_ids, n_max), None
    return Prediction(int(n_hat), None if n_upper is None else int(n_upper), start, clock())
