"""TimeBill budget math (Eq. 2, 5-11)."""

import math

import pytest

from timebill_ros.config import OnlineSettings
from timebill_ros.timing import budget
from timebill_ros.timing.model import TimingCoefficients
from timebill_ros.timing.online import TimeModel


class Coeffs:
    """Eq. 4 coefficients with the closed forms of Eq. 4a and Eq. 6-7."""

    def __init__(self, a, b, c, p, q):
        self.a, self.b, self.c, self.p, self.q = a, b, c, p, q

    def prefill_s(self, n_x):
        return self.a * n_x ** 2 + self.b * n_x + self.c

    def decode_phase_s(self, n_x, alpha, n_tokens):
        return sum(self.p * ((1 - alpha) * n_x + i - 1) + self.q for i in range(1, n_tokens))


COEFFS = Coeffs(a=1e-7, b=2e-3, c=0.02, p=2e-5, q=0.05)


def test_eq2_predicted_tokens_caps_at_n_max():
    assert budget.predicted_tokens(3, 16, 128) == 48
    assert budget.predicted_tokens(30, 16, 128) == 128
    with pytest.raises(ValueError, match='bucket_size'):
        budget.predicted_tokens(1, 0, 128)


def test_pessimistic_tokens():
    assert budget.pessimistic_tokens(10, 5, 128) == 50
    assert budget.pessimistic_tokens(40, 5, 128) == 128
    with pytest.raises(ValueError, match='k must be'):
        budget.pessimistic_tokens(10, 0.5, 128)


def test_upper_tokens_prefers_the_quantile_when_known():
    assert budget.upper_tokens(10, 5, 128) == 50  # no N^_q: TimeBill's k N^
    assert budget.upper_tokens(10, 5, 128, n_upper=30) == 30  # N^_q, not k N^
    assert budget.upper_tokens(10, 5, 128, n_upper=500) == 128  # capped at N_max
    assert budget.upper_tokens(40, 5, 128, n_upper=16) == 40  # never below N^
    with pytest.raises(ValueError, match='n_upper'):
        budget.upper_tokens(10, 5, 128, n_upper=-1)


@pytest.mark.parametrize('budget_s', [2.0, 3.0, 4.0, 6.0])
def test_alpha_star_makes_wcet_meet_the_budget_exactly(budget_s):
    n_x, n_w = 2000, 50
    alpha = budget.alpha_star(budget_s, n_x, n_w, COEFFS.prefill_s(n_x), 0.1,
                              COEFFS.p, COEFFS.q, alpha_max=0.999)
    if 0 < alpha < 0.999:
        wcet = COEFFS.prefill_s(n_x) + COEFFS.decode_phase_s(n_x, alpha, n_w)
        assert math.isclose(0.1 + wcet, budget_s, rel_tol=1e-9)


def test_alpha_star_is_the_smallest_feasible_ratio():
    n_x, n_w, t_budget = 2000, 50, 8.0
    alpha = budget.alpha_star(t_budget, n_x, n_w, COEFFS.prefill_s(n_x), 0.0,
                              COEFFS.p, COEFFS.q, alpha_max=0.95)
    assert 0 < alpha < 0.95
    below = alpha - 0.01
    wcet_below = COEFFS.prefill_s(n_x) + COEFFS.decode_phase_s(n_x, below, n_w)
    assert wcet_below > t_budget


def test_alpha_star_clamps():
    n_x, n_w = 500, 40
    generous = budget.alpha_star(100.0, n_x, n_w, COEFFS.prefill_s(n_x), 0, COEFFS.p,
                                 COEFFS.q, 0.95)
    impossible = budget.alpha_star(0.01, n_x, n_w, COEFFS.prefill_s(n_x), 0, COEFFS.p,
                                   COEFFS.q, 0.95)
    assert generous == 0.0
    assert impossible == 0.95


def test_alpha_star_degenerate_cases_keep_the_cache():
    assert budget.alpha_star(1.0, 100, 1, 0.1, 0, 1e-5, 0.05, 0.95) == 0.0
    assert budget.alpha_star(1.0, 0, 10, 0.1, 0, 1e-5, 0.05, 0.95) == 0.0
    assert budget.alpha_star(1.0, 100, 10, 0.1, 0, 0.0, 0.05, 0.95) == 0.0
    with pytest.raises(ValueError, match='finite'):
        budget.alpha_star(float('nan'), 100, 10, 0.1, 0, 1e-5, 0.05, 0.95)


def test_decide_fixed_alpha_and_fit_flag():
    """The one alpha* entry (decide_remaining), on a model with no margin, k N^ = N^_W."""
    model = TimeModel(TimingCoefficients(a=1e-7, b=2e-3, c=0.02, p=2e-5, q=0.05),
                      OnlineSettings(prior_margin=1.0))
    decision = budget.decide_remaining(model, 100.0, 1000, 20, 128, 5.0, 0.95)
    assert decision.n_w == 100 and decision.alpha == 0.0 and decision.fits
    fixed = budget.decide_remaining(model, 0.5, 1000, 20, 128, 5.0, 0.95, fixed_alpha=0.5)
    assert fixed.alpha == 0.5 and not fixed.fits
    assert math.isclose(fixed.remaining_s,
                        model.evict_s(1000, 'worst') + COEFFS.decode_phase_s(1000, 0.5, 100))
