"""The prefill of a goal whose prompt head comes from the prefix store, and its calibration.

With P of its N_x tokens copied from the store (engine/prefix_store.py), a goal prefills
tokens P..N_x attending over all before them: Eq. 4a's difference a (N_x^2 - P^2) + b (N_x - P)
plus one forward pass's c. Each prompt token is also copied once: out of the store (the P
cached ones) or into it (the rest, kept for later goals), r seconds a token, so r N_x in all.
r is fitted by least squares on probes that prefill a random prompt into a scratch store,
then prefill the same prompt with its tail replaced (a hit of P tokens, the rest fresh and
stored), timed as goals run. The calibration file keeps the raw ``prefix_points``
``(P, N_x, seconds)``.
"""

from typing import Callable, Optional

import numpy as np

from timebill_ros.engine.prefix_store import PrefixStore
from timebill_ros.engine.stopping import StopCriteria

PROBE_TOKENS = (1024, 2048)   # N_x of the probes (capped by the context)
PROBE_FRESH = 64              # tokens of each probe's new tail
PROBE_TAILS = 2               # hits timed per length (different tails)
PROBE_BLOCK_TOKENS = 32


def hit_rest_s(coefficients, n_cached: int, n_x: int) -> float:
    """Return Eq. 4a's cost of tokens ``n_cached``..``n_x`` with one pass's c, seconds."""
    return coefficients.prefill_s(n_x) - coefficients.prefill_s(n_cached) + coefficients.c


def fit_copy_token_s(coefficients, points) -> float:
    """Return r >= 0, seconds per copied prompt token, from ``((P, N_x, seconds), ...)``.

    Least squares of the measured time minus :func:`hit_rest_s` on N_x (one unknown, clamped
    at 0). 0 without points.
    """
    rows = [(int(p), int(n), float(t)) for p, n, t in points if p > 0]
    if not rows:
        return 0.0
    copied = np.array([n for _, n, _ in rows], dtype=float)
    extra = np.array([t - hit_rest_s(coefficients, p, n) for p, n, t in rows])
    return max(0.0, float(copied @ extra / (copied @ copied)))


def hit_mape_pct(coefficients, points, copy_token_s: float) -> Optional[float]:
    """Return the MAPE (percent) of the hit model on ``points``; None without points."""
    rows = [(p, n, t) for p, n, t in points if p > 0 and t > 0]
    if not rows:
        return None
    errors = [abs(hit_rest_s(coefficients, p, n) + copy_token_s * n - t) / t
              for p, n, t in rows]
    return 100.0 * float(np.mean(errors))


def probe_prefix(engine, lengths=PROBE_TOKENS, fresh=PROBE_FRESH, tails=PROBE_TAILS,
                 progress: Optional[Callable[[str], None]] = None):
    """Time prefills that hit a scratch prefix store; return ``[(P, N_x, seconds), ...]``.

    For each length N_x (those the context allows): a prefill of N_x random tokens fills
    the store (not a point), then ``tails`` prompts sharing all but their last ``fresh``
    tokens prefill from it, each a point. The store's copy in and out is timed, as for goals.
    """
    store = PrefixStore(PROBE_BLOCK_TOKENS, 1 << 40, min_tokens=0,
                        fresh_tokens=engine.eviction_config.window_size + 1)
    points = []
    for n_x in (n for n in lengths if n + 1 < engine.context_tokens):
        ids = engine.random_ids(n_x)
        engine.prefill(ids, StopCriteria(), store=store)
        for tail in range(1, tails + 1):
            new_tail = engine.random_ids(fresh + tail)[-fresh:]
            hit_ids = ids[:n_x - fresh] + new_tail
            match = store.match(hit_ids)
            state = engine.prefill(hit_ids, StopCriteria(), prefix=match, store=store)
            points.append((state.n_cached, n_x, state.prefill_s))
            if progress is not None:
                progress(f'prefix hit P={state.n_cached} N_x={n_x}: {state.prefill_s:.3f} s')
    return points
