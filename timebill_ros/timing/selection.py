"""Which few (n_in, n_out) probes to measure: exponential schedule or SimFLi's FSP.

Both pick ``k`` prompt lengths from the available ones and pair them with answer lengths
drawn with a fixed seed (SimFLi Sec. 5.2: the same output lengths for every method).
"""

import math
import random
from typing import Callable, Sequence

from timebill_ros.checks import check_int

SAT_THRESHOLD = 0.10  # tau: a TPS drop of 10 % between halvings marks the boundary


def _available(values):
    """Return ``values`` as a sorted tuple of distinct token counts >= 1."""
    values = tuple(sorted({check_int('length', v, 1) for v in values}))
    if not values:
        raise ValueError('need at least one available length')
    return values


def _nearest_log(values, target):
    """Return the element of ``values`` nearest to ``target`` in log space (ties: smaller)."""
    # Rounded so that exact geometric midpoints (e.g. 181.02 between 128 and 256) tie.
    return min(values, key=lambda v: (round(abs(math.log(v) - math.log(target)), 9), v))


def exponential_inputs(available: Sequence[int], k: int):
    """Return k prompt lengths spaced geometrically from min to max, snapped to ``available``.

    Snapping can merge two targets; the nearest unused lengths then fill up to k.
    """
    values = _available(available)
    k = check_int('k', k, 1)
    if k > len(values):
        raise ValueError(f'k={k} exceeds the {len(values)} available lengths')
    lo, hi = values[0], values[-1]
    targets = [lo * (hi / lo) ** (j / (k - 1)) for j in range(k)] if k > 1 else [hi]
    chosen = []
    for target in targets:
        free = [v for v in values if v not in chosen]
        chosen.append(_nearest_log(free, target))
    return tuple(sorted(chosen))


def output_lengths(available: Sequence[int], k: int, seed=0):
    """Return k answer lengths drawn from ``available`` with ``random.Random(seed)``."""
    values = _available(available)
    rng = random.Random(seed)
    return tuple(rng.choice(values) for _ in range(check_int('k', k, 1)))


def halving_trace(available, ttft_s_of: Callable[[int], float], tau=SAT_THRESHOLD):
    """Run SimFLi Alg. 1, lines 1-8: halve from the longest prompt until prefill TPS drops.

    ttft_s_of(n) measures (or looks up) the prefill seconds at n tokens. Returns
    ``(trace, boundary)``: the lengths measured, in order, and ``(s_hi, s_lo)`` where
    TPS(s_lo) / TPS(s_hi) <= 1 - tau first held, or None.
    """
    values = _available(available)
    trace, tps, current = [], {}, float(values[-1])
    while current >= values[0]:
        s = _nearest_log(values, current)
        if s not in tps:
            tps[s] = s / ttft_s_of(s)
            if trace and tps[s] / tps[trace[-1]] <= 1.0 - tau:
                trace.append(s)
                return tuple(trace), (trace[-2], s)
            trace.append(s)
        current /= 2.0
    return tuple(trace), None


def _fill_symmetric(values, chosen, k):
    """Add the nearest unchosen lengths above and below ``chosen``, alternately, up to k."""
    chosen = set(chosen)
    upper = True
    while len(chosen) < min(k, len(values)):
        above = [v for v in values if v > max(chosen)]
        below = [v for v in values if v < min(chosen)]
        side = above if (upper and above) or not below else below
        chosen.add(min(side) if side is above else max(side))
        upper = not upper
    return tuple(sorted(chosen))


def fsp_inputs(available: Sequence[int], k: int, ttft_s_of: Callable[[int], float],
               tau=SAT_THRESHOLD):
    """Select k prompt lengths by SimFLi's FSP (Alg. 1 / App. D); return (inputs, trace).

    With a boundary (s_hi, s_lo): both ends, the index-space midpoint between them when one
    exists and k is odd, then the nearest lengths on each side. Without: the last traced
    length and its neighbours. ``trace`` lists the lengths whose TTFT the trace measured.
    """
    values = _available(available)
    k = check_int('k', k, minimum=3)
    trace, boundary = halving_trace(values, ttft_s_of, tau)
    if boundary is None:
        return _fill_symmetric(values, [trace[-1] if trace else values[-1]], k), trace
    s_hi, s_lo = boundary
    chosen = [s_hi, s_lo]
    i_hi, i_lo = values.index(s_hi), values.index(s_lo)
    if k % 2 == 1 and i_hi - i_lo >= 2:
        chosen.append(values[(i_hi + i_lo) // 2])
    return _fill_symmetric(values, chosen, k), trace
