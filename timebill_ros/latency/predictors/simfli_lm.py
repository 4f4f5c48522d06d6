"""SimFLi LM (Eq. 1-2): phase coefficients from the mean inverse throughput of the probes.

coef_prefill = mean_i(1 / TPS_prefill(s_i)) = mean_i(TTFT_i / n_in_i) seconds per prompt
token; coef_decode = mean_i(decode_i / n_out_i) seconds per answer token;
L = coef_prefill n_in + coef_decode n_out + C, with C the mean residual on the probes.
"""

import numpy as np

from timebill_ros.latency.predictors.base import (
    TOKENS, LatencyModel, LatencyPredictor, check_probes, probe_arrays)


def mean_residual(model, probes):
    """Return SimFLi's constant C: mean of measured minus predicted end-to-end seconds."""
    return float(np.mean([p.e2e_s - model.e2e_s(p.n_in, p.n_out) for p in probes]))


class SimFLiLinear(LatencyPredictor):
    """Eq. 1-2 of SimFLi."""

    name = 'SimFLi (LM)'
    min_probes = 1

    def fit(self, probes):
        """Average the probes' inverse throughputs; C from the residuals."""
        probes = check_probes(probes, self.min_probes)
        n_in, n_out, ttft, decode, _ = probe_arrays(probes)
        coef_prefill = float(np.mean(ttft / n_in))
        coef_decode = float(np.mean(decode / n_out))
        model = LatencyModel(prefill=lambda n: coef_prefill * n,
                             step=lambda n: coef_decode + 0.0 * n, decode_count=TOKENS)
        return LatencyModel(model.prefill, model.step, mean_residual(model, probes), TOKENS)
