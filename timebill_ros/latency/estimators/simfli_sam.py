"""SimFLi LM+SAM (Eq. 3-4): saturating prefill throughput, constant decode throughput.

TPS_prefill(n) = a n / (b + n) tokens/s is fitted to the probes' n_in / TTFT by
``scipy.optimize.curve_fit`` (a > 0, b >= 0); TPS_decode = c is Eq. 1's harmonic mean. Then
L = (b + n_in) / a + n_out / c + C, C the mean residual on the probes. Note that
n / TPS_prefill(n) = (b + n) / a is linear in n: the model cannot bend upwards where
attention's quadratic cost takes over on long prompts.
"""

import numpy as np
import scipy.optimize

from timebill_ros.latency.estimators.base import LatencyPredictor, check_probes, probe_arrays
from timebill_ros.latency.estimators.simfli_lm import simfli_model


def fit_saturating_tps(n_in, tps):
    """Return (a tokens/s, b tokens) of TPS(n) = a n / (b + n) fitted to (n_in, tps)."""
    def tps_of(n, a, b):
        return a * n / (b + n)
    start = (float(np.max(tps)), float(np.median(n_in)))
    (a, b), _ = scipy.optimize.curve_fit(tps_of, n_in, tps, p0=start,
                                         bounds=([1e-9, 0.0], [np.inf, np.inf]), maxfev=20000)
    return float(a), float(b)


class SimFLiSaturating(LatencyPredictor):
    """Eq. 3-4 of SimFLi (LM+SAM); with FSP-selected probes it is LM+SAM+FSP."""

    name = 'SimFLi (LM+SAM)'
    min_probes = 2

    def fit(self, probes):
        """Fit the saturating prefill TPS; decode TPS and C by simfli_model."""
        probes = check_probes(probes, self.min_probes)
        n_in, _, ttft, _, _ = probe_arrays(probes)
        a, b = fit_saturating_tps(n_in, n_in / ttft)
        return simfli_model(lambda n: (b + n) / a, probes)
