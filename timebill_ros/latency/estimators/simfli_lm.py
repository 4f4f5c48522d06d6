"""SimFLi LM (Eq. 1-2): phase coefficients from the mean inverse throughput of the probes.

coef_prefill = mean_i(1 / TPS_prefill(s_i)) = mean_i(TTFT_i / n_in_i) seconds per prompt
token; coef_decode = mean_i(decode_i / n_out_i) seconds per answer token;
L = coef_prefill n_in + coef_decode n_out + C, with C the mean residual on the probes.
"""

import dataclasses

import numpy as np

from timebill_ros.latency.estimators.base import (
    TOKENS, LatencyModel, LatencyPredictor, check_probes, probe_arrays)


def simfli_model(prefill, probes):
    """Return SimFLi's L with this ``prefill`` (n_in -> seconds), fitted to ``probes``.

    Decoding costs coef_decode = mean_i(decode_i / n_out_i) seconds per answer token (Eq. 1);
    C is the mean of measured minus predicted end-to-end seconds on the probes.
    """
    _, n_out, _, decode, _ = probe_arrays(probes)
    coef_decode = float(np.mean(decode / n_out))
    model = LatencyModel(prefill=prefill, step=lambda n: coef_decode + 0.0 * n,
                         decode_count=TOKENS)
    constant_s = float(np.mean([p.e2e_s - model.e2e_s(p.n_in, p.n_out) for p in probes]))
    return dataclasses.replace(model, constant_s=constant_s)


class SimFLiLinear(LatencyPredictor):
    """Eq. 1-2 of SimFLi."""

    name = 'SimFLi (LM)'
    min_probes = 1

    def fit(self, probes):
        """Average the probes' inverse prefill throughputs; decode and C by simfli_model."""
        probes = check_probes(probes, self.min_probes)
        n_in, _, ttft, _, _ = probe_arrays(probes)
        coef_prefill = float(np.mean(ttft / n_in))
        return simfli_model(lambda n: coef_prefill * n, probes)
