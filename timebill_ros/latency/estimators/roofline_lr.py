"""Roofline-LR: linear regression of measured end-to-end seconds on the roofline time.

L = w1 T_roof(n_in, n_out) + w0, fitted by least squares (numpy.linalg.lstsq) to the probes;
the pieces scale the same way (prefill w1 T_prefill + w0, decoding step w1 T_step).
"""

import numpy as np

from timebill_ros.latency.estimators.base import LatencyModel, check_probes
from timebill_ros.latency.estimators.roofline import Roofline


class RooflineRegression(Roofline):
    """Roofline time rescaled by a line fitted to the probes."""

    name = 'roofline-LR'
    min_probes = 2

    def fit(self, probes):
        """Fit w1, w0 of measured e2e vs. analytic e2e on the probes."""
        probes = check_probes(probes, self.min_probes)
        roof = super().fit(())
        analytic = np.array([roof.e2e_s(p.n_in, p.n_out) for p in probes])
        measured = np.array([p.e2e_s for p in probes])
        design = np.column_stack([analytic, np.ones_like(analytic)])
        w1, w0 = np.linalg.lstsq(design, measured, rcond=None)[0]
        return LatencyModel(prefill=lambda n: w1 * roof.prefill(n) + w0,
                            step=lambda n: w1 * roof.step(n))
