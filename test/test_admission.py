"""Admission policies (server/admission/) and the after-prefill budget (decide_remaining)."""

import pytest

from timebill_ros.server.admission import (AcceptAllPolicy, FeasibilityPolicy, make_admission,
                                           POLICIES, Verdict)
from timebill_ros.server.goals import GoalRequest
from timebill_ros.server.job import Job
from timebill_ros.server.overrun import policy_by_name
from timebill_ros.timing import budget
from timebill_ros.timing.model import TimingCoefficients
from timebill_ros.config import OnlineSettings
from timebill_ros.timing.online import EVICT_PRIOR_S_PER_TOKEN, TimeModel, WORST

# Dyadic numbers, so the least times are exact: with no margin (prior_margin 1) a 128-token
# prompt's prefill is 128 / 128 + 0.5 = 1.5 s and one step at 128 cached tokens
# 128 / 1024 + 0.125 = 0.25 s: least end-to-end 1.75 s.
EXACT = TimingCoefficients(a=0.0, b=2.0 ** -7, c=0.5, p=2.0 ** -10, q=0.125)
NO_MARGIN = OnlineSettings(prior_margin=1.0)
N_X = 128


def make_job(policy='kill', received_s=0.0, deadline_s=1.0, n_x=N_X):
    """Return a Job of ``n_x`` prompt tokens under the overrun policy ``policy``."""
    return Job(request=GoalRequest(prompt='go to the kitchen', budget_s=deadline_s - received_s),
               goal_id='g1', received_s=received_s, deadline_s=deadline_s,
               policy=policy_by_name(policy), n_max=64, input_ids=list(range(n_x)),
               on_feedback=lambda feedback: None, on_done=lambda result: None)


@pytest.fixture
def exact_model():
    """Return a TimeModel whose LEAST bound is the calibration itself."""
    return TimeModel(EXACT, NO_MARGIN)


def test_least_time_by_hand(exact_model):
    assert exact_model.least_e2e_s(N_X) == 1.75


@pytest.mark.parametrize('policy', ['kill', 'partial', 'skip_next'])
def test_feasible_goal_is_admitted(exact_model, policy):
    verdict = FeasibilityPolicy(exact_model).check(make_job(policy, 10.0, 12.0), 10.0)
    assert verdict == Verdict(admit=True, infeasible=False, min_time_s=1.75, message='')


def test_feasibility_boundary(exact_model):
    policy = FeasibilityPolicy(exact_model)
    # Exactly the least time left: admitted; a microsecond less: not.
    assert policy.check(make_job('kill', 0.0, 1.75), 0.0).admit is True
    tight = policy.check(make_job('kill', 0.0, 1.75 - 2.0 ** -20), 0.0)
    assert tight.admit is False and tight.infeasible is True


def test_feasible_min_time_is_the_models_least_time():
    model = TimeModel(EXACT, predict_s=lambda n_x: 2.0)  # default margins, predictor overhang
    model.observe_prefill(N_X, 3.0)
    job = make_job('kill', 0.0, 20.0)
    verdict = FeasibilityPolicy(model).check(job, 0.0)
    assert verdict.admit is True and verdict.infeasible is False
    assert verdict.min_time_s == model.least_e2e_s(N_X)
    # By hand: prefill 2 x 1.5 / 1.3, overhang 2 / 1.3 - 3 x 1.3 < 0 -> 0, step 0.25 / 1.3.
    assert verdict.min_time_s == pytest.approx((3.0 + 0.25) / 1.3, rel=1e-12)


@pytest.mark.parametrize('policy', ['kill', 'partial'])
def test_infeasible_stopping_goal_is_refused_at_receipt(exact_model, policy):
    verdict = FeasibilityPolicy(exact_model).check(make_job(policy, 5.0, 6.0), 5.0)
    assert verdict.admit is False and verdict.infeasible is True
    assert verdict.min_time_s == 1.75
    assert verdict.message == 'infeasible: needs at least 1.75 s, budget 1.00 s'


@pytest.mark.parametrize('policy', ['kill', 'partial'])
def test_infeasible_stopping_goal_is_refused_after_queueing(exact_model, policy):
    job = make_job(policy, 0.0, 2.5)
    admission = FeasibilityPolicy(exact_model)
    assert admission.check(job, 0.0).admit is True  # 2.5 s left at receipt
    verdict = admission.check(job, 1.25, queued=True)  # 1.25 s left after 1.25 s queued
    assert verdict.admit is False and verdict.infeasible is True
    assert verdict.message == ('infeasible after 1.25 s queued: needs at least 1.75 s, '
                               '1.25 s left of the 2.50 s budget')
    late = admission.check(job, 3.0, queued=True)  # past the deadline: 0 s left, not < 0
    assert late.message == ('infeasible after 3.00 s queued: needs at least 1.75 s, '
                            '0.00 s left of the 2.50 s budget')
    assert late.admit is False and late.infeasible is True


def test_infeasible_skip_next_goal_runs_marked(exact_model):
    verdict = FeasibilityPolicy(exact_model).check(make_job('skip_next', 5.0, 6.0), 5.0)
    assert verdict.admit is True and verdict.infeasible is True
    assert verdict.min_time_s == 1.75
    assert verdict.message == 'infeasible: needs at least 1.75 s, budget 1.00 s'


def test_make_admission(exact_model):
    assert set(POLICIES) == {'feasibility', 'none'}
    feasibility = make_admission('feasibility', exact_model)
    assert isinstance(feasibility, FeasibilityPolicy) and feasibility.name == 'feasibility'
    accept_all = make_admission('none', exact_model)
    assert isinstance(accept_all, AcceptAllPolicy) and accept_all.name == 'none'
    for policy in ('kill', 'partial', 'skip_next'):
        verdict = accept_all.check(make_job(policy, 0.0, 0.5), 0.25, queued=True)
        assert verdict == Verdict(admit=True, infeasible=False, min_time_s=1.75, message='')
    assert AcceptAllPolicy().check(make_job(), 0.0) == Verdict(admit=True, min_time_s=0.0)
    with pytest.raises(ValueError, match="unknown admission policy 'edf'"):
        make_admission('edf', exact_model)


# --- decide_remaining ------------------------------------------------------------------
# p = 1 ms per cached token, q = 10 ms; N_x = 100, N^ = 10, k = 2 -> N^_W = 20 (19 steps).
# Keeping the whole cache: 19 (0.1 + 0.01) + 1e-3 19 18 / 2 = 2.261 s; eviction 5 ms.
ROUND = TimingCoefficients(a=0.0, b=0.01, c=0.5, p=1e-3, q=0.01)


def decide(model, time_left_s, **kwargs):
    """Return decide_remaining for N_x 100, N^ 10, N_max 64, k 2, alpha_max 0.9."""
    return budget.decide_remaining(model, time_left_s, 100, 10, 64, 2, 0.9, **kwargs)


def test_whole_cache_kept_when_it_fits():
    model = TimeModel(ROUND, NO_MARGIN)
    decision = decide(model, 2.3)
    assert (decision.n_hat, decision.n_w, decision.alpha) == (10, 20, 0.0)
    assert decision.remaining_s == pytest.approx(2.261, rel=1e-12)
    assert decision.fits is True
    # A little eviction would be faster (5 ms + 2.242 s at alpha 0.01) and fit too, but
    # alpha stays 0: nothing is evicted while the whole cache fits.
    assert 0.005 + ROUND.decode_phase_s(100, 0.01, 20) < 2.3


def test_alpha_star_for_the_time_left_minus_eviction():
    model = TimeModel(ROUND, NO_MARGIN)
    decision = decide(model, 2.0)
    # By hand: 1 - (2.0 - 0.005) / (1e-3 100 19) + 18 / 200 + 0.01 / 0.1 = 0.14.
    assert decision.alpha == pytest.approx(0.14, rel=1e-12)
    assert decision.alpha == budget.alpha_star(2.0 - 0.005, 100, 20, 0.0, 0.0, 1e-3, 0.01, 0.9)
    # Eviction plus 19 steps from 86 kept tokens: 0.005 + 19 (0.086 + 0.01) + 0.171 = 2.0 s.
    assert decision.remaining_s == pytest.approx(2.0, rel=1e-12)
    assert decision.fits  # alpha* fits exactly; the last bits of rounding are tolerated


def test_alpha_star_uses_the_worst_decode_coefficients():
    model = TimeModel(ROUND)  # default prior margin 1.3
    model.observe_decode(100, 8, 2 * ROUND.decode_phase_s(100, 0.0, 9))  # twice as slow
    model.observe_evict(100, 0.01)  # eviction twice the prior
    coefficients = model.decode_coefficients('worst')
    assert coefficients.p == pytest.approx(2.6e-3, rel=1e-12)
    assert coefficients.q == pytest.approx(0.026, rel=1e-12)
    evict_s = model.evict_s(100, WORST)
    assert evict_s == pytest.approx(2 * 1.3 * 100 * EVICT_PRIOR_S_PER_TOKEN, rel=1e-12)
    time_left = 4.0
    assert coefficients.decode_phase_s(100, 0.0, 20) > time_left  # 5.8786 s: must evict
    decision = decide(model, time_left)
    expected = budget.alpha_star(time_left - evict_s, 100, 20, 0.0, 0.0, coefficients.p,
                                 coefficients.q, 0.9)
    assert 0.0 < expected < 0.9
    assert decision.alpha == expected
    assert decision.remaining_s == pytest.approx(
        evict_s + coefficients.decode_phase_s(100, expected, 20), rel=1e-12)
    assert decision.remaining_s == pytest.approx(time_left, rel=1e-12)
    assert decision.fits == (decision.remaining_s <= time_left)


def test_alpha_solved_at_one_bound_is_reported_at_another():
    """alpha* at DECIDE (a lower residual quantile), t^_WCET's remaining time at WORST."""
    model = TimeModel(ROUND, OnlineSettings(min_residuals=0, decision_quantile=0.5))
    decode = model.phases['decode']
    decode.residuals.extend([1.0, 1.0, 1.0, 2.0])  # WORST margin 2, DECIDE margin 1
    time_left = 2.3  # alpha 0 fits at margin 1 (2.261 s), not at 2
    worst = decide(model, time_left)
    split = decide(model, time_left, bound='decide', report_bound='worst')
    assert worst.alpha > 0.0 and split.alpha == 0.0
    assert split.remaining_s == pytest.approx(2 * 2.261, rel=1e-12)
    assert split.fits is False
    same = decide(model, time_left, bound='decide')
    assert same.alpha == 0.0 and same.remaining_s == pytest.approx(2.261, rel=1e-12)


def test_fixed_alpha_is_honoured():
    model = TimeModel(ROUND, NO_MARGIN)
    # 0.005 + 19 (0.05 + 0.01) + 0.171 = 1.316 s, even though alpha 0 would fit 2.3 s.
    fixed = decide(model, 2.3, fixed_alpha=0.5)
    assert fixed.alpha == 0.5
    assert fixed.remaining_s == pytest.approx(1.316, rel=1e-12)
    assert fixed.fits is True
    short = decide(model, 1.0, fixed_alpha=0.5)
    assert short.alpha == 0.5 and short.fits is False
    assert short.remaining_s == pytest.approx(1.316, rel=1e-12)
    none = decide(model, 1.0, fixed_alpha=0.0)  # no eviction, no eviction cost
    assert none.alpha == 0.0 and none.remaining_s == pytest.approx(2.261, rel=1e-12)


def test_hopeless_budget_clamps_at_alpha_max():
    model = TimeModel(ROUND, NO_MARGIN)
    decision = decide(model, 0.3)
    assert decision.alpha == 0.9
    # 0.005 + 19 (1e-3 10 + 0.01) + 0.171 = 0.556 s > 0.3 s.
    assert decision.remaining_s == pytest.approx(0.556, rel=1e-12)
    assert decision.fits is False
    negative = decide(model, -1.0)  # already past the deadline
    assert negative.alpha == 0.9 and negative.fits is False


# Step time dominated by q, as on the real machine (p N_x is ~15 % of a step there): eviction
# buys little. Whole cache, 19 steps: 19 (0.1 + 0.01) + 1e-4 19 18 / 2 = 2.1071 s.
STEP_BOUND = TimingCoefficients(a=0.0, b=0.01, c=0.5, p=1e-4, q=0.1)


def test_expected_fallback_when_no_alpha_meets_the_worst_bound():
    model = TimeModel(STEP_BOUND)  # prior margin 1.3 on the WORST bound, none on EXPECTED
    worst = model.decode_coefficients('worst')
    expected = model.decode_coefficients('expected')
    assert (worst.q, expected.q) == (pytest.approx(0.13, rel=1e-12), 0.1)
    assert expected.decode_phase_s(100, 0.0, 20) == pytest.approx(2.1071, rel=1e-12)
    # 2.3 s: the whole cache fits at EXPECTED; at WORST not even alpha_max does (2.52 s).
    time_left = 2.3
    assert model.evict_s(100, WORST) + worst.decode_phase_s(100, 0.9, 20) > time_left
    paper = decide(model, time_left)
    assert paper.alpha == 0.9 and paper.fits is False
    kept = decide(model, time_left, fallback_bound='expected')
    assert kept.alpha == 0.0
    # The promise is still reported at WORST: the whole cache, 19 steps with the margin.
    assert kept.remaining_s == pytest.approx(worst.decode_phase_s(100, 0.0, 20), rel=1e-12)
    assert kept.fits is False
    # 2.09 s: the whole cache misses EXPECTED too; alpha* is solved at EXPECTED, below 0.9.
    some = decide(model, 2.09, fallback_bound='expected')
    evict_s = model.evict_s(100, 'expected')
    by_hand = budget.alpha_star(2.09 - evict_s, 100, 20, 0.0, 0.0, 1e-4, 0.1, 0.9)
    assert 0.0 < by_hand < 0.9
    assert some.alpha == by_hand
    assert evict_s + expected.decode_phase_s(100, by_hand, 20) == pytest.approx(2.09)


def test_a_hopeless_goal_keeps_its_whole_cache():
    model = TimeModel(STEP_BOUND)
    expected = model.decode_coefficients('expected')
    worst = model.decode_coefficients('worst')
    # 1.5 s: even alpha_max misses the EXPECTED bound (19 steps of at least 0.1 s).
    time_left = 1.5
    assert model.evict_s(100, 'expected') + expected.decode_phase_s(100, 0.9, 20) > time_left
    clamped = decide(model, time_left, fallback_bound='expected')
    assert clamped.alpha == 0.9 and clamped.fits is False
    kept = decide(model, time_left, fallback_bound='expected', keep_cache_when_hopeless=True)
    assert kept.alpha == 0.0 and kept.fits is False
    assert kept.remaining_s == pytest.approx(worst.decode_phase_s(100, 0.0, 20), rel=1e-12)
    # Without the fallback, hopeless means alpha_max misses the WORST bound (2.52 s).
    assert decide(model, 2.3).alpha == 0.9
    assert decide(model, 2.3, keep_cache_when_hopeless=True).alpha == 0.0
    # A goal that fits at some alpha is left alone: EXPECTED fits below alpha_max at 2.09 s.
    some = decide(model, 2.09, fallback_bound='expected')
    assert 0.0 < some.alpha < 0.9
    assert decide(model, 2.09, fallback_bound='expected', keep_cache_when_hopeless=True) == some
    squeezed = decide(model, 2.7)  # meets WORST at 0 < alpha* < 0.9
    assert decide(model, 2.7, keep_cache_when_hopeless=True) == squeezed
    # A fixed ratio is never overridden.
    assert decide(model, 1.5, fixed_alpha=0.5, keep_cache_when_hopeless=True).alpha == 0.5


def test_expected_fallback_leaves_a_fitting_worst_choice_alone():
    model = TimeModel(STEP_BOUND)
    plain = decide(model, 3.0)
    assert plain.fits and plain.alpha == 0.0
    assert decide(model, 3.0, fallback_bound='expected') == plain
    squeezed = decide(model, 2.7)  # 0 < alpha* < 0.9 meets WORST: the fallback stays out
    assert squeezed.fits and 0.0 < squeezed.alpha < 0.9
    assert decide(model, 2.7, fallback_bound='expected') == squeezed
