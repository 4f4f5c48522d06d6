"""TimeBill budget math: Eq. 2 and Eq. 5-11 of the TimeBill paper.

Units: seconds and tokens. ``coefficients`` is any object with the Eq. 4 coefficients
``p`` (s/token), ``q`` (s) and the methods ``prefill_s(n_x)`` and
``decode_phase_s(n_x, alpha, n_tokens)`` (see ``timing_model.TimingCoefficients``).
"""

import dataclasses
import math


def predicted_tokens(bucket_index: int, bucket_size: int, n_max: int) -> int:
    """Eq. 2: N^ = min(N_max, n^ B) for a predicted bucket index n^ of size B tokens."""
    if bucket_index < 0 or bucket_size < 1 or n_max < 1:
        raise ValueError(
            f'need bucket_index >= 0, bucket_size >= 1, n_max >= 1; got '
            f'{bucket_index!r}, {bucket_size!r}, {n_max!r}')
    return min(n_max, bucket_index * bucket_size)


def pessimistic_tokens(n_hat: int, k: float, n_max: int) -> int:
    """N^_W = min(k N^, N_max), tokens (Sec. 4.2); k >= 1 is the pessimistic factor."""
    if not math.isfinite(k) or k < 1:
        raise ValueError(f'pessimistic factor k must be finite and >= 1, got {k!r}')
    if n_hat < 0 or n_max < 1:
        raise ValueError(f'need n_hat >= 0 and n_max >= 1, got {n_hat!r} and {n_max!r}')
    return min(n_max, math.ceil(k * n_hat))


def alpha_star(budget_s, n_x, n_w, t_prefill_hat_s, t_predict_s, p, q, alpha_max):
    """Eq. 11: the smallest KV eviction ratio whose WCET estimate fits the budget.

    Solving Eq. 10b with Eq. 6-7 and 9 for alpha gives
        1 - (T - t^_prefill - t_Predict) / (p N_x (N_W - 1)) + (N_W - 2) / (2 N_x) + q / (p N_x)
    The paper prints the middle term as (N_W - 2) / (2 p N_x); dimensional analysis (and
    summing Eq. 6 over i = 1..N_W-1) gives (N_W - 2) / (2 N_x), which is what we use.
    The result is clamped to [0, alpha_max] (Eq. 10c).

    budget_s: T, seconds left for this inference. n_x: prompt tokens. n_w: N^_W tokens.
    t_prefill_hat_s: Eq. 4a estimate, seconds. t_predict_s: predictor time not hidden behind
    the prefill, seconds. p, q: Eq. 4b coefficients (s/token, s).
    """
    if not math.isfinite(budget_s):
        raise ValueError(f'budget_s must be finite, got {budget_s!r}')
    if n_w <= 1 or n_x <= 0 or p <= 0:
        # No decoding step, no prompt KV, or decode time independent of the KV length:
        # eviction cannot buy time, so keep the whole cache.
        return 0.0
    steps = n_w - 1
    slack = budget_s - t_prefill_hat_s - t_predict_s
    alpha = 1.0 - slack / (p * n_x * steps) + (n_w - 2) / (2.0 * n_x) + q / (p * n_x)
    return min(alpha_max, max(0.0, alpha))


@dataclasses.dataclass(frozen=True)
class RemainingDecision:
    """The budget decision taken after the prefill (tokens, ratio, seconds from now).

    remaining_s: eviction (when alpha > 0) plus the decoding phase of N^_W tokens at alpha,
    at the time model's bound. fits: remaining_s <= the time left.
    """

    n_hat: int
    n_w: int
    alpha: float
    remaining_s: float
    fits: bool


def upper_tokens(n_hat: int, k: float, n_max: int, n_upper=None) -> int:
    """N^_W, tokens: min(N_max, max(N^, N^_q)) when the predictor gave N^_q, else k N^.

    N^_q is the q-quantile of the predicted length distribution (``budget.upper_quantile``):
    the length the answer stays under with probability q, which is what the WCET of Eq. 9
    needs; TimeBill's k N^ stands in for it when only a point prediction is known.
    """
    if n_upper is None:
        return pessimistic_tokens(n_hat, k, n_max)
    if n_upper < 0 or n_max < 1:
        raise ValueError(f'need n_upper >= 0 and n_max >= 1, got {n_upper!r} and {n_max!r}')
    return min(n_max, max(n_hat, n_upper))


def decide_remaining(time_model, time_left_s, n_x, n_hat, n_max, k, alpha_max,
                     fixed_alpha=None, bound='worst', fallback_bound=None,
                     keep_cache_when_hopeless=False, n_upper=None, report_bound=None):
    """Pick alpha for the time actually left after the prefill and the predictor.

    Eq. 11 with T - t^_prefill - t_Predict replaced by what they are once both have run:
    ``time_left_s`` = deadline - now, seconds. The decoding coefficients p, q and the
    eviction time come from ``time_model`` (timing.online.TimeModel) at ``bound`` (WORST or
    DECIDE: corrected speed x learned margin at an upper residual quantile). Keeping the
    whole cache is preferred whenever it fits, since eviction itself costs time; otherwise
    alpha* is solved for the time left minus the eviction. fallback_bound: when no alpha <=
    alpha_max fits at ``bound``, alpha is chosen the same way at this bound (e.g. EXPECTED)
    instead of clamping to alpha_max; None = the paper's clamp. ``remaining_s`` and ``fits``
    are at ``report_bound``.
    keep_cache_when_hopeless: when not even alpha_max fits (at the fallback bound if there
    is one, else at ``bound``), keep the whole cache (alpha 0) instead of clamping to
    alpha_max: the goal is predicted to miss whatever is evicted, and each evicted token
    costs answer quality.
    fixed_alpha: when not None, use it (the fixed-ratio baselines).
    n_upper: N^_q, tokens, or None: N^_W is :func:`upper_tokens`.
    report_bound: the bound ``remaining_s`` and ``fits`` are given at (t^_WCET: WORST while
    alpha is solved at DECIDE); None = ``bound``.
    """
    n_w = upper_tokens(n_hat, k, n_max, n_upper)
    alpha, remaining = _choose(time_model, time_left_s, n_x, n_w, alpha_max, bound)
    report = remaining if report_bound in (None, bound) else _remaining_at(
        time_model, n_x, n_w, report_bound)[0]
    if fixed_alpha is not None:
        alpha = float(fixed_alpha)
    elif not fits_in(remaining(alpha), time_left_s):
        last = remaining
        if fallback_bound is not None:
            alpha, last = _choose(time_model, time_left_s, n_x, n_w, alpha_max, fallback_bound)
        if keep_cache_when_hopeless and not fits_in(last(alpha), time_left_s):
            alpha = 0.0
    need_s = report(alpha)
    return RemainingDecision(n_hat=n_hat, n_w=n_w, alpha=alpha, remaining_s=need_s,
                             fits=fits_in(need_s, time_left_s))


def _remaining_at(time_model, n_x, n_w, bound):
    """Return (remaining, coefficients, evict_s) of the time model at ``bound``.

    remaining(alpha): seconds of eviction (when alpha > 0) plus N_W decoding steps.
    coefficients: Eq. 4 with p, q at ``bound``; evict_s: the eviction's seconds.
    """
    coefficients = time_model.decode_coefficients(bound)
    evict_s = time_model.evict_s(n_x, bound)

    def remaining(alpha):
        return (evict_s if alpha > 0 else 0.0) + coefficients.decode_phase_s(n_x, alpha, n_w)

    return remaining, coefficients, evict_s


def _choose(time_model, time_left_s, n_x, n_w, alpha_max, bound):
    """Return (alpha, remaining) at ``bound`` (remaining: :func:`_remaining_at`).

    alpha: 0 when the whole cache fits the time left, else Eq. 11 net of the eviction.
    """
    remaining, coefficients, evict_s = _remaining_at(time_model, n_x, n_w, bound)
    if remaining(0.0) <= time_left_s:
        return 0.0, remaining
    return alpha_star(time_left_s - evict_s, n_x, n_w, 0.0, 0.0, coefficients.p,
                      coefficients.q, alpha_max), remaining


def fits_in(need_s, time_left_s):
    """Return whether ``need_s`` seconds fit ``time_left_s``, up to the last bits of rounding.

    alpha* solves need_s == time_left_s exactly, so an exact comparison would reject it.
    """
    return need_s <= time_left_s + 1e-9 * max(1.0, abs(time_left_s))
