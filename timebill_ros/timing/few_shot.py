"""Few-shot calibration: Eq. 4 from five probes, in bounded time (``timebill profile --few-shot``).

SimFLi's measurement budget (five (n_in, n_out) probes, prompt lengths spaced exponentially,
answer lengths drawn with a fixed seed) with TimeBill's cost model: the prefill quadratic is
fitted to the five TTFTs and the decoding-step line to each probe's mean step time at its
mean cache length. The result is the same :class:`Calibration` file ``timebill profile`` writes,
with method ``few_shot``. Why Eq. 4 and not SimFLi's own Eq. 4: see docs/calibration.md
(on long prompts the prefill bends upwards, which SimFLi's linear form cannot follow).
"""

import math
import time
from typing import Callable, Optional

from timebill_ros.timing.design import GridDesign
from timebill_ros.timing.selection import exponential_inputs, output_lengths
from timebill_ros.checks import check_int
from timebill_ros.engine.probe import timed_probe
from timebill_ros.timing.probes import probes_of
from timebill_ros.timing.profiler import engine_config_of, held_out_mape, key_fields
from timebill_ros.timing.model import (Calibration, TimingCoefficients, fit_decode, fit_prefill,
                                       now_iso)

PROBES = 5
MAX_TOKENS = 2048
WARM_UP = (64, 2)      # (n_in, n_out) of the unrecorded warm-up probe
ESTIMATE_MARGIN = 0.25  # relative margin on a probe's estimated seconds


def decode_points(probes):
    """Return ``(n_kv, step_s)`` lists, one entry per probe with at least one decoding step.

    n_kv: the probe's mean cache length, rounded to a token. step_s: its mean step seconds.
    """
    timed = [p for p in probes if p.step_s]
    return ([round(p.n_in + (p.n_out - 2) / 2) for p in timed],
            [p.decode_s / len(p.step_s) for p in timed])


def fit_probes(probes):
    """Return the Eq. 4 TimingCoefficients of ``probes`` by bounded least squares.

    Prefill a n^2 + b n + c on every probe's TTFT; decoding step p n_kv + q on each probe's
    mean step time at its mean cache length (for a line, the mean of steps at n_kv = n_in ..
    n_in + n_out - 2 equals the step at their mean), one point per probe, as the calibration
    file stores them. Needs >= 3 distinct n_in.
    """
    a, b, c = fit_prefill([p.n_in for p in probes], [p.ttft_s for p in probes])
    p, q = fit_decode(*decode_points(probes))
    return TimingCoefficients(a, b, c, p, q)


def few_shot_probes(context_tokens, k=PROBES, max_tokens=MAX_TOKENS, seed=0,
                    design: Optional[GridDesign] = None):
    """Return k (n_in, n_out) probes: exponential n_in, seeded n_out (tokens).

    Candidates are the design's in-distribution lengths (``GridDesign()`` by default) that fit
    ``max_tokens`` and the context, so the probes are cells of the evaluation grid.
    """
    design = design or GridDesign()
    n_out = output_lengths(design.probe_n_out, k, seed)
    limit = min(check_int('max_tokens', max_tokens, 1),
                check_int('context_tokens', context_tokens, 1) - max(n_out) + 1)
    candidates = [n for n in design.id_n_in if n <= limit]
    if len(candidates) < 3:
        raise ValueError(f'max_tokens={max_tokens} leaves {len(candidates)} prompt lengths; '
                         'the prefill fit needs >= 3')
    inputs = exponential_inputs(candidates, min(k, len(candidates)))
    return tuple(zip(inputs, n_out))


def _estimate_s(seen, n_in, n_out):
    """Return an upper estimate, seconds, of a probe from the probes ``seen`` so far.

    Past the longest prompt seen, its prefill scales by (n_in / m)^e, e the growth exponent
    between the two longest prompts seen, clamped to [1, 2] (2 with only one seen: prefill
    grows at most quadratically). Between two prompts seen, the chord between their
    prefills (Eq. 4a is convex: it lies below). Decoding steps cost at most the slowest step
    seen. Plus ESTIMATE_MARGIN; 0 before any probe.
    """
    if not seen:
        return 0.0
    by_length = sorted({p.n_in: p.ttft_s for p in seen}.items())
    m, t_m = by_length[-1]
    exponent = 2.0
    if len(by_length) >= 2 and t_m > 0 and by_length[-2][1] > 0:
        (m0, t_0) = by_length[-2]
        exponent = min(2.0, max(1.0, math.log(t_m / t_0) / math.log(m / m0)))
    prefill = t_m * max(1.0, n_in / m) ** exponent
    below = [(n, t) for n, t in by_length if n <= n_in]
    above = [(n, t) for n, t in by_length if n >= n_in]
    if below and above and n_in < m:
        (lo, t_lo), (hi, t_hi) = below[-1], above[0]
        prefill = t_hi if hi == lo else t_lo + (t_hi - t_lo) * (n_in - lo) / (hi - lo)
    step = max((max(p.step_s) for p in seen if p.step_s), default=0.0)
    return (1.0 + ESTIMATE_MARGIN) * (prefill + (n_out - 1) * step)


def range_first(probes):
    """Return ``probes`` in the order they are measured: the range's ends first.

    The shortest, the middle one, then the longest, then the others longest first: when the
    time limit cuts the calibration short, it drops probes inside the range measured, not
    the long end (a 0.5B model on 2 cores skipped its 2048-token probe measured last, and
    the fit on prompts up to 512 tokens over-estimated a 9k-token prefill 4x). The middle
    probe before the longest lets its estimate extrapolate from two lengths a decade apart.
    """
    ordered = sorted(probes)
    if len(ordered) <= 2:
        return ordered
    head = [ordered[0], ordered[len(ordered) // 2], ordered[-1]]
    return head + sorted((p for p in ordered if p not in head), reverse=True)


LONG_END_N_OUT = 2  # a stand-in for the longest probe: its prefill and one step


def _measure(engine, probes, warm_up, time_limit_s, clock, start, say, order=range_first,
             lengths=()):
    """Measure ``probes`` in ``order`` (:func:`range_first`); skip those that would overrun.

    A probe is skipped when its estimate exceeds the time left; the longest one is then
    replaced by the longest of ``lengths`` (prompt tokens) below it whose prefill and one
    step fit, so the fit still reaches as far as the time allows (skipped outright, a 0.5B
    model's 2048-token probe left a fit on prompts up to 512 tokens that over-estimated an
    8k-token prefill 2.8x). ``warm_up`` (a Probe) informs the estimates only; it is not
    returned. Returns the probes measured.
    """
    measured = []
    longest = max(n for n, _ in probes)
    for n_in, n_out in order(probes):
        left = None if time_limit_s is None else time_limit_s - (clock() - start)
        if left is not None and _estimate_s([warm_up] + measured, n_in, n_out) > left:
            say(f'skipped probe n_in={n_in}, n_out={n_out}: would exceed '
                f'time_limit_s={time_limit_s:g}')
            if n_in != longest:
                continue
            seen = {n for n, _ in probes}
            fits = [n for n in lengths if n < n_in and n not in seen and _estimate_s(
                [warm_up] + measured, n, LONG_END_N_OUT) <= left]
            if not fits:
                continue
            n_in, n_out = max(fits), LONG_END_N_OUT
            say(f'the long end instead: probe n_in={n_in}, n_out={n_out}')
        probe = timed_probe(engine, n_in, n_out)
        measured.append(probe)
        say(f'[{len(measured)}/{len(probes)}] probe n_in={n_in}, n_out={n_out}: ttft '
            f'{probe.ttft_s:.3f} s, step {probe.decode_s / max(n_out - 1, 1) * 1e3:.1f} ms')
    return measured


def few_shot_profile(engine, *, engine_config=None, k=PROBES, max_tokens=MAX_TOKENS, seed=0,
                     time_limit_s=None, clock: Callable[[], float] = time.monotonic,
                     progress: Optional[Callable[[str], None]] = None,
                     order: Callable = range_first):
    """Calibrate Eq. 4 from k probes on ``engine``; return a :class:`Calibration`.

    engine: offers ``measure_probe(n_in, n_out)`` and ``context_tokens``. time_limit_s:
    seconds; a probe expected to overrun it is skipped (RuntimeError if fewer than 3 prompt
    lengths remain). order: probes -> the order they are measured in (:func:`range_first`;
    ``sorted``: shortest first, as before). The MAPEs in the file are those of a fit on 3 of
    the 5 probes, scored on the other 2 (indices 1 and 4), as
    :func:`timebill_ros.timing.profiler.profile` holds out.
    """
    if time_limit_s is not None and (not math.isfinite(time_limit_s) or time_limit_s <= 0):
        raise ValueError(f'time_limit_s must be finite and > 0, got {time_limit_s!r}')
    say = progress or (lambda _msg: None)
    engine = probes_of(engine)
    probes = few_shot_probes(engine.context_tokens, k, max_tokens, seed)
    start = clock()
    say(f'few-shot calibration: {len(probes)} probes (n_in, n_out) {list(probes)}')
    warm_up = timed_probe(engine, *WARM_UP)
    lengths = tuple(n for n in GridDesign().id_n_in if n <= max(n for n, _ in probes))
    measured = _measure(engine, probes, warm_up, time_limit_s, clock, start, say, order,
                        lengths)
    if len({p.n_in for p in measured}) < 3:
        raise RuntimeError(f'few-shot calibration measured {len(measured)} probe(s) within '
                           f'time_limit_s={time_limit_s}; the prefill fit needs 3 prompt '
                           'lengths: allow more time or lower max_tokens')
    coefficients = fit_probes(measured)
    prefill = tuple((p.n_in, p.ttft_s) for p in measured)
    decode = tuple(zip(*decode_points(measured)))
    key = key_fields(engine_config_of(engine, engine_config))
    return Calibration(
        coefficients=coefficients, model_key=key[0], device=key[1], dtype=key[2],
        threads=key[3], prefill_mape_pct=held_out_mape('prefill', dict(enumerate(prefill)), 3),
        decode_mape_pct=held_out_mape('decode', dict(enumerate(decode)), 3),
        n_points=len(prefill) + len(decode), profiling_s=max(clock() - start, 0.0),
        created=now_iso(), method='few_shot', prefill_points=prefill, decode_points=decode)
