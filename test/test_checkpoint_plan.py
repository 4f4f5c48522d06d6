"""timing/checkpoint.py: the rescue rule of timebill-online, on an injected time model."""

import pytest

from timebill_ros.config import OnlineSettings
from timebill_ros.timing.budget import decide_remaining
from timebill_ros.timing.checkpoint import CacheNow, plan_rest, plan_s, steps_s
from timebill_ros.timing.model import TimingCoefficients
from timebill_ros.timing.online import EXPECTED, TimeModel

# A step of 10 ms + 10 us per cached token: 40 ms at 3k tokens, 10.4 ms at 5 % of them.
COEFFICIENTS = TimingCoefficients(a=0.0, b=1e-4, c=0.0, p=1e-5, q=0.01)
N_X, N_W, SEGMENT, ALPHA_MAX = 3000, 128, 16, 0.95


def fixed_model():
    """Return the time model as calibrated (no speed factor, no margin): every bound is Eq. 4."""
    return TimeModel(COEFFICIENTS, OnlineSettings(enabled=False))


def start(alpha_now=0.0):
    return CacheNow(n_x=N_X, n_prompt_kv=N_X - round(alpha_now * N_X), n_answer_kv=0,
                    alpha_now=alpha_now)


def full_cache_s(n_tokens):
    """Seconds of ``n_tokens`` - 1 steps on the whole cache (token 1 is the prefill's)."""
    return steps_s(COEFFICIENTS, N_X, n_tokens - 1)


def test_steps_match_eq_4b_summed():
    co = COEFFICIENTS
    assert steps_s(co, 100, 3) == pytest.approx(sum(co.p * (100 + i) + co.q for i in range(3)))
    assert steps_s(co, 100, 0) == 0.0
    # decode_phase_s counts N - 1 steps from (1 - alpha) N_x: the same sum.
    assert steps_s(co, 1500, 127) == pytest.approx(co.decode_phase_s(3000, 0.5, 128))


def test_the_whole_cache_is_kept_when_the_rest_fits():
    plan = plan_rest(fixed_model(), full_cache_s(N_W) * 1.01, start(), N_W - 1, SEGMENT,
                     ALPHA_MAX, EXPECTED)
    assert plan.alpha == 0.0 and not plan.evicts and plan.fits


def test_the_first_decision_waits_where_the_one_shot_evicts():
    """1.25 x a 74-token answer's time: Eq. 11 evicts for N^_W = 128, the rule does not."""
    model = fixed_model()
    budget_s = 1.25 * full_cache_s(74)
    one_shot = decide_remaining(model, budget_s, N_X, 128, 128, 5.0, ALPHA_MAX,
                                bound=EXPECTED)
    plan = plan_rest(model, budget_s, start(), N_W - 1, SEGMENT, ALPHA_MAX, EXPECTED)
    assert one_shot.alpha > 0.3
    assert plan.alpha == 0.0 and plan.fits


def test_without_a_planned_rest_the_alpha_is_the_smallest_that_fits():
    model = fixed_model()
    budget_s = 0.36 * full_cache_s(N_W)  # alpha_max at once fits 0.33 of it
    plan = plan_rest(model, budget_s, start(), N_W - 1, SEGMENT, ALPHA_MAX, EXPECTED,
                     n_rest_plan=0)
    assert 0 < plan.alpha < ALPHA_MAX and plan.evicts and plan.fits
    assert plan_s(model, start(), plan.alpha - 0.01, N_W - 1, SEGMENT, ALPHA_MAX,
                  EXPECTED) > budget_s


def test_an_eviction_is_sized_for_the_planned_rest():
    """Once it evicts, it evicts what the planned rest needs on one cache: no second one."""
    model = fixed_model()
    budget_s = 0.4 * full_cache_s(N_W)
    least = plan_rest(model, budget_s, start(), N_W - 1, SEGMENT, ALPHA_MAX, EXPECTED,
                      n_rest_plan=0)
    sized = plan_rest(model, budget_s, start(), N_W - 1, SEGMENT, ALPHA_MAX, EXPECTED)
    assert 0 < least.alpha < sized.alpha < ALPHA_MAX
    flat = decide_remaining(model, budget_s, N_X, N_W, N_W, 1.0,
                            ALPHA_MAX, bound=EXPECTED)
    assert sized.alpha == pytest.approx(flat.alpha, abs=2 / N_X)  # Eq. 11 for the rest


def simulate(budget_s, n_tokens, n_rest_bound=N_W):
    """Decode ``n_tokens`` on the time model, re-deciding every SEGMENT tokens.

    The model is the truth here (every step takes what it says), and the rest is bounded by
    ``n_rest_bound`` - n. Returns (seconds taken with the evictions, the alphas decided).
    """
    model, cache, elapsed, alphas = fixed_model(), start(), 0.0, []
    n = 1
    while n < n_tokens:
        plan = plan_rest(model, budget_s - elapsed, cache, n_rest_bound - n, SEGMENT,
                         ALPHA_MAX, EXPECTED)
        alphas.append(plan.alpha)
        if plan.evicts:
            elapsed += model.evict_s(cache.n_prompt_kv)
            cache = CacheNow(N_X, N_X - round(plan.alpha * N_X), cache.n_answer_kv,
                             plan.alpha)
        steps = min(SEGMENT, n_tokens - n)
        elapsed += steps_s(COEFFICIENTS, cache.n_prompt_kv + cache.n_answer_kv, steps)
        cache = CacheNow(N_X, cache.n_prompt_kv, cache.n_answer_kv + steps, cache.alpha_now)
        n += steps
    return elapsed, alphas


@pytest.mark.parametrize('share', [0.3, 0.34, 0.36, 0.45, 0.6, 0.95, 1.1])
@pytest.mark.parametrize('n_tokens', [40, 74, 128])
def test_every_answer_within_the_bound_meets_a_deadline_the_one_shot_meets(share, n_tokens):
    """Wherever alpha_max after the prefill fits N^_W, deciding later still meets it."""
    budget_s = share * full_cache_s(N_W)
    model = fixed_model()
    if plan_s(model, start(), ALPHA_MAX, N_W - 1, SEGMENT, ALPHA_MAX, EXPECTED) > budget_s:
        # Not even alpha_max fits: the rule clamps to it (the paper's Eq. 10c) and says so.
        plan = plan_rest(model, budget_s, start(), N_W - 1, SEGMENT, ALPHA_MAX, EXPECTED)
        assert plan.alpha == ALPHA_MAX and not plan.fits
        return
    elapsed, alphas = simulate(budget_s, n_tokens)
    assert elapsed <= budget_s + 1e-9
    assert alphas == sorted(alphas)  # what is evicted stays evicted


def test_a_short_answer_decodes_most_of_its_tokens_on_the_whole_cache():
    """A 74-token answer at 1.25 x its full-cache time.

    Eq. 11 evicts 43 % before token 2; the rule keeps the whole cache to token 65 and then
    evicts what the rest of N^_W would need: the first 64 tokens are the full-cache answer's.
    """
    budget_s = 1.25 * full_cache_s(74)
    elapsed, alphas = simulate(budget_s, 74)
    one_shot = decide_remaining(fixed_model(), budget_s, N_X, 128, 128, 5.0, ALPHA_MAX,
                                bound=EXPECTED)
    assert one_shot.alpha > 0.4
    assert elapsed <= budget_s and alphas[:4] == [0.0] * 4 and alphas[4] > 0


@pytest.mark.parametrize('bad', [0, -1, 1.5, None])
def test_a_bad_segment_is_refused(bad):
    with pytest.raises(ValueError, match='segment'):
        plan_rest(fixed_model(), 1.0, start(), 10, bad, ALPHA_MAX, EXPECTED)


def test_a_bad_cache_is_refused():
    with pytest.raises(ValueError, match='n_prompt_kv'):
        CacheNow(n_x=10, n_prompt_kv=-1, n_answer_kv=0, alpha_now=0.0)
    with pytest.raises(ValueError, match='alpha_now'):
        CacheNow(n_x=10, n_prompt_kv=10, n_answer_kv=0, alpha_now=1.0)


def test_the_latest_end_is_the_whole_cache_or_the_deadline():
    """t^_WCET's rest: the whole rest on this cache where it fits, else the time left."""
    model = fixed_model()
    roomy = plan_rest(model, 2 * full_cache_s(N_W), start(), N_W - 1, SEGMENT, ALPHA_MAX,
                      EXPECTED)
    assert roomy.latest_s == pytest.approx(full_cache_s(N_W))
    budget_s = 0.6 * full_cache_s(N_W)
    tight = plan_rest(model, budget_s, start(), N_W - 1, SEGMENT, ALPHA_MAX, EXPECTED)
    assert tight.fits and tight.latest_s == pytest.approx(budget_s)
    elapsed, _ = simulate(budget_s, N_W)
    assert elapsed <= tight.latest_s + 1e-9


def test_near_the_end_the_rest_is_kept_rather_than_rescued():
    """Keep 20 tokens that fit on the whole cache, though the rescue plan would not fit.

    The rescue plan (16 tokens on it, an eviction, 4 on alpha_max's cache): its eviction
    costs more than it saves.
    """
    model = fixed_model()
    rest_s = steps_s(COEFFICIENTS, N_X, 20)
    rescue_s = steps_s(COEFFICIENTS, N_X, 16) + model.evict_s(N_X) + steps_s(
        COEFFICIENTS, N_X - round(ALPHA_MAX * N_X) + 16, 4)
    assert rescue_s > rest_s * 1.001
    plan = plan_rest(model, rest_s * 1.001, start(), 20, SEGMENT, ALPHA_MAX, EXPECTED)
    assert plan.alpha == 0.0 and plan.fits
