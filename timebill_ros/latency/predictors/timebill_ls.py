"""TimeBill's execution-time model (Eq. 4) fitted by bounded least squares.

Prefill a n^2 + b n + c on every probe's TTFT; decoding step p n_kv + q on each probe's mean
step time at its mean cache length (for a line, the mean of steps at n_kv = n_in ..
n_in + n_out - 2 equals the step at their mean), one point per probe, as the calibration file
stores them. Fitted on a full grid it is the
reference; fitted on five probes it is the few-shot calibration ``timebill profile
--few-shot`` writes.
"""

from timebill_ros.latency.predictors.base import (
    LatencyPredictor, check_probes, model_from_coefficients)
from timebill_ros.timing.model import TimingCoefficients, fit_decode, fit_prefill


def decode_points(probes):
    """Return ``(n_kv, step_s)`` lists, one entry per probe with at least one decoding step.

    n_kv: the probe's mean cache length, rounded to a token. step_s: its mean step seconds.
    """
    timed = [p for p in probes if p.step_s]
    return ([round(p.n_in + (p.n_out - 2) / 2) for p in timed],
            [p.decode_s / len(p.step_s) for p in timed])


class TimeBillLeastSquares(LatencyPredictor):
    """Eq. 4a / 4b by ``scipy.optimize.lsq_linear`` with non-negative coefficients."""

    name = 'TimeBill LS (Eq. 4)'
    min_probes = 3

    def fit(self, probes):
        """Fit Eq. 4 to the probes' TTFTs and decoding steps (>= 3 distinct n_in needed)."""
        probes = check_probes(probes, self.min_probes)
        a, b, c = fit_prefill([p.n_in for p in probes], [p.ttft_s for p in probes])
        p, q = fit_decode(*decode_points(probes))
        return model_from_coefficients(TimingCoefficients(a, b, c, p, q))
