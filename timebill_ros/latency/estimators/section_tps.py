"""Section-TPS (Narayanan et al., 2023): piecewise-linear prefill, linear decode.

Between measured prompt lengths the prefill time is interpolated linearly (each section has
its own inverse throughput); beyond the ends the end sections' slopes extrapolate. One decode
slope beta, seconds per token, is fitted through the origin to decode time vs. n_out - 1.
"""

import numpy as np

from timebill_ros.latency.estimators.base import (
    LatencyModel, LatencyPredictor, check_probes, probe_arrays)


def _sections(n_in, ttft_s):
    """Return sorted distinct n_in and their mean TTFT (at least 2 distinct lengths)."""
    xs = np.unique(n_in)
    if len(xs) < 2:
        raise ValueError(f'Section-TPS needs >= 2 distinct n_in, got {xs.tolist()}')
    ys = np.array([ttft_s[n_in == x].mean() for x in xs])
    return xs, ys


def piecewise_linear(xs, ys):
    """Return f(n): linear interpolation through (xs, ys), end slopes beyond the ends."""
    low = (ys[1] - ys[0]) / (xs[1] - xs[0])
    high = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])

    def f(n):
        n = np.asarray(n, dtype=float)
        inside = np.interp(n, xs, ys)
        below = ys[0] + low * (n - xs[0])
        above = ys[-1] + high * (n - xs[-1])
        return np.where(n < xs[0], below, np.where(n > xs[-1], above, inside))
    return f


class SectionTps(LatencyPredictor):
    """Piecewise-linear prefill through the probes' TTFTs plus one decode slope."""

    name = 'Section-TPS'
    min_probes = 2

    def fit(self, probes):
        """Fit the sections and the decode slope (numpy least squares through the origin)."""
        n_in, n_out, ttft, decode, _ = probe_arrays(check_probes(probes, self.min_probes))
        steps = n_out - 1.0
        if not np.any(steps > 0):
            raise ValueError('Section-TPS needs a probe with n_out >= 2 for the decode slope')
        beta = float(np.dot(steps, decode) / np.dot(steps, steps))
        return LatencyModel(prefill=piecewise_linear(*_sections(n_in, ttft)),
                            step=lambda n: beta + 0.0 * np.asarray(n))
