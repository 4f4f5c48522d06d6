"""Plain linear regression on the few probes: L = w0 + w1 n_in + w2 n_out (SimFLi's LR)."""

import numpy as np

from timebill_ros.latency.estimators.base import (
    TOKENS, LatencyModel, LatencyPredictor, check_probes, probe_arrays)


class LinearRegression(LatencyPredictor):
    """Ordinary least squares (numpy.linalg.lstsq) of end-to-end seconds on n_in and n_out.

    The pieces follow from the same weights: prefill w0 + w1 n_in, one output token w2.
    """

    name = 'LR'
    min_probes = 3

    def fit(self, probes):
        """Fit the three weights to the probes' end-to-end times."""
        n_in, n_out, _, _, e2e = probe_arrays(check_probes(probes, self.min_probes))
        design = np.column_stack([np.ones_like(n_in), n_in, n_out])
        w0, w1, w2 = np.linalg.lstsq(design, e2e, rcond=None)[0]
        return LatencyModel(prefill=lambda n: w0 + w1 * n, step=lambda n: w2 + 0.0 * n,
                            decode_count=TOKENS)
