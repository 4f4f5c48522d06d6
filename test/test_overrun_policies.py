"""Each overrun policy's answer at every decision a deadline forces (server/overrun/base.py).

The goal path's tests (test_deadlines, test_admission, test_checkpoints, test_remote*) run
these decisions through real goals; this is the table of what each policy answers.
"""

import pytest

from timebill_ros.engine import stopping
from timebill_ros.server.overrun import POLICIES
from timebill_ros.timing.goal_budget import BudgetRules
from timebill_ros.timing.online import LEAST, WORST


def _clock():
    return 10.0


# policy: (admits infeasible, expiry of a goal due at 5 s needing 2 s, skips queued while 1 s
# late, gives up when it cannot finish, step bound, clamps alpha, keeps text, discards 0.1 s
# late, caps max_tokens)
TABLE = {
    'kill': (False, 3.0, False, True, LEAST, True, False, True, True),
    'partial': (False, 3.0, False, True, WORST, False, True, False, False),
    'skip_next': (True, 5.0, True, False, LEAST, True, False, False, False),
}


@pytest.mark.parametrize('name', sorted(TABLE))
def test_each_policy_answers_every_decision(name):
    policy = POLICIES[name]
    (admits, expiry_s, skips, gives_up, bound, clamps, keeps, discards, caps) = TABLE[name]
    assert policy.admits_infeasible() is admits
    assert policy.queue_expiry_s(5.0, 2.0) == expiry_s
    assert policy.skips_queued(own_deadline_s=9.0, now_s=10.0) is skips
    assert policy.skips_queued(own_deadline_s=11.0, now_s=10.0) is False  # not yet late
    assert policy.gives_up(lambda: True) is gives_up
    assert policy.gives_up(lambda: False) is False
    assert policy.budget_rules() == BudgetRules(step_bound=bound, clamps_alpha=clamps)
    assert policy.keeps_text() is keeps
    assert policy.discards_late(0.1) is discards
    assert policy.discards_late(0.0) is False  # on time is never discarded
    assert policy.caps_tokens_to_fit() is caps


@pytest.mark.parametrize('name', sorted(TABLE))
def test_a_policy_that_gives_up_stops_prefill_and_decoding_for_time(name):
    policy = POLICIES[name]
    prefill = policy.prefill_criteria(10.5, lambda n_done: 1.0, _clock)
    decode = policy.decode_criteria(10.5, lambda n_generated: 1.0, lambda n: 5.0, _clock)
    gives_up = TABLE[name][3]
    assert [type(c) for c in prefill] == ([stopping.PrefillCannotFinish] if gives_up else [])
    assert [type(c) for c in decode] == ([stopping.NextStepCannotFinish] if gives_up else [])
    if gives_up:  # 10 s now + 1 s left to do > 10.5 s: each stops for time
        assert stopping.StopCriteria(prefill).check(0, None, 0) == stopping.CANNOT_FINISH
        assert stopping.StopCriteria(decode).check(1) == stopping.CANNOT_FINISH


def test_a_goal_budget_takes_rules_not_a_policy():
    from timebill_ros.timing.goal_budget import GoalBudget
    with pytest.raises(TypeError, match='BudgetRules'):
        GoalBudget(object(), 10, 1.0, POLICIES['kill'])


def test_the_rest_of_an_answer_is_its_predicted_steps_then_n_max():
    import types
    from timebill_ros.timing.goal_budget import GoalBudget
    model = types.SimpleNamespace(step_s=lambda n_kv, bound: 0.01 * (1 + n_kv / 1000))
    budget = GoalBudget(model, 100, 1.0, POLICIES['kill'].budget_rules())
    assert budget.rest_s(1000, 10, 30, 128) == pytest.approx(20 * 0.02)  # N^ = 30
    assert budget.rest_s(1000, 40, 30, 128) == pytest.approx(88 * 0.02)  # past N^: N_max
    assert budget.rest_s(1000, 128, 30, 128) == 0.0
