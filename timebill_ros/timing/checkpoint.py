"""Deciding the eviction again while the answer decodes: the rescue rule (timebill-online).

TimeBill's Eq. 11 evicts once, after the prefill, for the worst length N^_W. With
checkpoints every m tokens (``budget.checkpoint_tokens``) the eviction can wait: a decision
only has to keep the deadline *reachable*. The plan judged at each checkpoint is

    evict to alpha now (if alpha is more than what is evicted already)
    -> s = min(m, R) steps at that cache
    -> evict to alpha_max (if more) -> the other R - s steps at that cache,

where R is the upper bound of the tokens still to come (N^_W - n at first; a re-prediction
later). The decision is the smallest alpha whose plan fits the time left. As long as the time
model and R bound what happens, the next checkpoint can always take the plan's own rescue (to
alpha_max at once), which then fits what is left; so no checkpoint finds the deadline out of
reach that the one-shot decision would have kept (docs/deadlines.md). What the wait buys:
answers that end before the rescue is needed keep their whole cache for longer, and every
token decoded before an eviction is the full-cache answer's token.

Units: seconds and tokens. ``time_model`` is a timing.online.TimeModel (or a ScaledSteps of
one): ``decode_coefficients(bound)`` (Eq. 4b: p s/token, q s) and ``evict_s(n, bound)``.
"""

import dataclasses

from timebill_ros.timing.budget import fits_in


@dataclasses.dataclass(frozen=True)
class RestPlan:
    """A checkpoint's decision.

    alpha: share of the prompt's N_x KV tokens evicted once it is applied (>= the share
    evicted already). rest_s: seconds of the whole plan (evictions and R steps) at the
    report bound. fits: rest_s <= the time left. evicts: alpha is more than evicted already.
    latest_s: the latest the rest ends, seconds from now, if every checkpoint keeps to the rule
    (at the report bound): the whole rest on the cache as it is where that fits the time
    left (the rule then never evicts), else the time left (the rule keeps a plan that fits
    it at every checkpoint), or rest_s where not even alpha_max fits. What t^_WCET counts.
    """

    alpha: float
    rest_s: float
    fits: bool
    evicts: bool
    latest_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class CacheNow:
    """The goal's cache at a checkpoint, tokens.

    n_x: prompt tokens (what alpha is a share of). n_prompt_kv: prompt tokens still cached.
    n_answer_kv: answer tokens cached (generated tokens already fed back). alpha_now: share
    of the prompt evicted so far.
    """

    n_x: int
    n_prompt_kv: int
    n_answer_kv: int
    alpha_now: float

    def __post_init__(self):
        for name in ('n_x', 'n_prompt_kv', 'n_answer_kv'):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f'{name} must be an int >= 0, got {value!r}')
        if not 0 <= self.alpha_now < 1:
            raise ValueError(f'alpha_now must be in [0, 1), got {self.alpha_now!r}')

    def kv_at(self, alpha: float) -> float:
        """Return the cached tokens once ``alpha`` of the prompt is evicted (never more)."""
        if alpha <= self.alpha_now:
            return float(self.n_prompt_kv + self.n_answer_kv)
        return float(kept_prompt(self.n_x, alpha) + self.n_answer_kv)


def kept_prompt(n_x: int, alpha: float) -> int:
    """Return the prompt tokens an eviction to ``alpha`` keeps, as the engine rounds them.

    engine.eviction.n_keep_for without its observation-window floor (the robot's timing
    code does not import the engine's torch scorers for one rounding).
    """
    return n_x - round(alpha * n_x)


def steps_s(coefficients, n_kv: float, n_steps: int) -> float:
    """Return the seconds of ``n_steps`` decoding steps from ``n_kv`` cached tokens.

    Eq. 4b summed while the cache grows by one token a step: n (p n_kv + q) + p n (n-1) / 2.
    """
    if n_steps <= 0:
        return 0.0
    return n_steps * (coefficients.p * n_kv + coefficients.q) \
        + coefficients.p * n_steps * (n_steps - 1) / 2.0


def plan_s(time_model, cache: CacheNow, alpha: float, n_rest: int, segment: int,
           alpha_max: float, bound: str) -> float:
    """Return the seconds of the plan that evicts to ``alpha`` now (module docstring).

    The cheaper of the plan with its rescue and of the whole rest on this cache (near the end
    of an answer the rescue's eviction can cost more than it saves). n_rest: R, tokens still
    to come at most. segment: m, tokens until the next checkpoint.
    """
    co = time_model.decode_coefficients(bound)
    now_s = time_model.evict_s(cache.n_prompt_kv, bound) if alpha > cache.alpha_now else 0.0
    first = min(segment, n_rest)
    kv = cache.kv_at(alpha)
    without_rescue = now_s + steps_s(co, kv, n_rest)  # the whole rest on this cache
    total = now_s + steps_s(co, kv, first)
    if n_rest > first:
        later = max(alpha, cache.alpha_now)
        if alpha_max > later:  # the rescue: evict to alpha_max after the segment
            # Bounded by the prompt cached now (the eviction's cost grows with it).
            total += time_model.evict_s(cache.n_prompt_kv, bound)
            kv = kept_prompt(cache.n_x, alpha_max) + cache.n_answer_kv
        total += steps_s(co, kv + first, n_rest - first)
    return min(total, without_rescue)


def plan_rest(time_model, time_left_s: float, cache: CacheNow, n_rest: int, segment: int,
              alpha_max: float, bound: str, report_bound: str = None,
              n_rest_plan: int = None) -> RestPlan:
    """Return the checkpoint's alpha in [alpha_now, alpha_max] and its plan's time.

    Keeps what is evicted when its plan fits ``time_left_s``. Otherwise it evicts now, to
    the larger of the smallest alpha whose plan fits and the alpha at which the next
    ``n_rest_plan`` tokens fit without another eviction (None: ``n_rest``; 0: none): once an
    eviction is paid for, it is sized for the rest expected, not only for the next segment
    (the smallest alpha alone evicts a little at each checkpoint and leaves the tail on
    alpha_max's cache). When not even alpha_max now fits, alpha_max (the paper's clamp; the
    caller decides whether to keep the cache instead).
    alpha is solved at ``bound`` (DECIDE), ``rest_s`` / ``fits`` given at ``report_bound``
    (WORST; None = ``bound``). time_left_s: deadline - now, seconds. n_rest, segment,
    n_rest_plan: tokens (:func:`plan_s`).
    """
    if not isinstance(segment, int) or segment < 1:
        raise ValueError(f'segment must be an int >= 1 token, got {segment!r}')
    for name, value in (('n_rest', n_rest), ('n_rest_plan', n_rest_plan)):
        if value is not None and (not isinstance(value, int) or value < 0):
            raise ValueError(f'{name} must be an int >= 0 tokens, got {value!r}')
    alpha = _solve(time_model, time_left_s, cache, n_rest, segment, alpha_max, bound)
    if alpha > cache.alpha_now:
        planned = n_rest if n_rest_plan is None else min(n_rest_plan, n_rest)
        alpha = max(alpha, _flat(time_model, time_left_s, cache, planned, alpha_max, bound))
    report = bound if report_bound is None else report_bound
    rest_s = plan_s(time_model, cache, alpha, n_rest, segment, alpha_max, report)
    fits = fits_in(rest_s, time_left_s)
    keep_s = steps_s(time_model.decode_coefficients(report), cache.kv_at(cache.alpha_now),
                     n_rest)
    latest_s = min(keep_s, max(time_left_s, rest_s)) if fits else rest_s
    return RestPlan(alpha=alpha, rest_s=rest_s, fits=fits, evicts=alpha > cache.alpha_now,
                    latest_s=latest_s)


def _solve(time_model, time_left_s, cache, n_rest, segment, alpha_max, bound) -> float:
    """Return the plan's alpha (see :func:`plan_rest`)."""
    def fits(alpha):
        return plan_s(time_model, cache, alpha, n_rest, segment, alpha_max,
                      bound) <= time_left_s
    keep = cache.alpha_now
    if keep >= alpha_max or fits(keep):
        return keep
    co = time_model.decode_coefficients(bound)
    first = min(segment, n_rest)
    if co.p <= 0 or first <= 0:  # steps do not depend on the cache: eviction buys nothing
        return keep
    # For keep < alpha < alpha_max the plan is linear in the cache kv kept now: the
    # segment costs first (p kv + q) + p first (first - 1) / 2; the evictions and the rest
    # after the rescue do not depend on alpha.
    fixed = time_model.evict_s(cache.n_prompt_kv, bound)
    if n_rest > first:
        fixed += time_model.evict_s(cache.n_prompt_kv, bound) + steps_s(
            co, kept_prompt(cache.n_x, alpha_max) + cache.n_answer_kv + first, n_rest - first)
    rescued = min(alpha_max, max(keep, _alpha_for(co, cache, time_left_s - fixed, first)))
    # The plan without the rescue: Eq. 11 for the whole rest; the smaller one that fits.
    flat = min(alpha_max, max(keep, _flat(time_model, time_left_s, cache, n_rest, alpha_max,
                                          bound)))
    for alpha in sorted((rescued, flat)):
        # The engine keeps whole tokens: step up a token or two.
        for extra in (0, 1, 2):
            candidate = min(alpha_max, alpha + extra / max(cache.n_x, 1))
            if candidate > keep and fits(candidate):
                return candidate
    return alpha_max


def _flat(time_model, time_left_s, cache, n_steps, alpha_max, bound) -> float:
    """Return the smallest alpha (<= alpha_max) for an eviction now and ``n_steps`` steps.

    That is, for the time ``time_left_s``: the one-shot decision (Eq. 11) for the rest; 0 for
    no steps.
    """
    co = time_model.decode_coefficients(bound)
    if n_steps <= 0 or co.p <= 0:
        return 0.0
    alpha = _alpha_for(co, cache, time_left_s - time_model.evict_s(cache.n_prompt_kv, bound),
                       n_steps)
    return min(alpha_max, max(0.0, alpha + 1.0 / max(cache.n_x, 1)))  # whole tokens


def _alpha_for(co, cache, left_s, n_steps) -> float:
    """Return the alpha whose cache makes ``n_steps`` steps take ``left_s`` (unclamped).

    :func:`steps_s` solved for its cache: kv = (left - n q - p n (n - 1) / 2) / (p n); p > 0,
    n >= 1.
    """
    kv = (left_s - n_steps * co.q - co.p * n_steps * (n_steps - 1) / 2.0) / (co.p * n_steps)
    return 1.0 - (kv - cache.n_answer_kv) / max(cache.n_x, 1)
