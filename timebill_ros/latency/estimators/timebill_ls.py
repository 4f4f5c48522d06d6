"""TimeBill's execution-time model (Eq. 4) fitted by bounded least squares.

The fit itself is the start-up calibration's (:func:`timebill_ros.timing.few_shot.fit_probes`):
fitted on a full grid it is the reference; fitted on five probes it is the few-shot
calibration ``timebill profile --few-shot`` writes.
"""

from timebill_ros.latency.estimators.base import (
    LatencyPredictor, check_probes, model_from_coefficients)
from timebill_ros.timing.few_shot import fit_probes


class TimeBillLeastSquares(LatencyPredictor):
    """Eq. 4a / 4b by ``scipy.optimize.lsq_linear`` with non-negative coefficients."""

    name = 'TimeBill LS (Eq. 4)'
    min_probes = 3

    def fit(self, probes):
        """Fit Eq. 4 to the probes' TTFTs and decoding steps (>= 3 distinct n_in needed)."""
        return model_from_coefficients(fit_probes(check_probes(probes, self.min_probes)))
