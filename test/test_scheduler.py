"""Scheduler policies (RT-LM Sec. IV-A/B) on plain goal records: no model, no clock."""

import types

import pytest

from timebill_ros.config import SchedulerConfig, ServerConfig
from timebill_ros.server.scheduler import (EdfPolicy, FifoPolicy, LeastUncertaintyFirst,
                                           MostUncertaintyFirst, SlackPolicy,
                                           UncertaintyPriority, make_scheduler_policy)


def goal(name, deadline_s, u_tokens, received_s=0.0, time_per_token_s=1.0):
    """Return a queued goal as policies see it; t^_J = u_J x time_per_token_s (no prefill)."""
    return types.SimpleNamespace(name=name, received_s=received_s, deadline_s=deadline_s,
                                 uncertainty_tokens=u_tokens,
                                 estimated_time_s=u_tokens * time_per_token_s)


def run_all(policy, goals, start_s=0.0):
    """Run ``goals`` back to back on one executor; return (order, names that missed)."""
    now, waiting, order, missed = start_s, list(goals), [], []
    while waiting:
        job = waiting.pop(policy.select(waiting, now))
        now += job.estimated_time_s
        order.append(job.name)
        if now > job.deadline_s:
            missed.append(job.name)
    return order, missed


# Five goals released together, as in RT-LM's Fig. 4 (whose numbers the text does not
# give): (name, deadline = priority point, u_J = execution time). The instance reproduces
# the figure's outcome: HPF (edf) misses J4 and J5, LUF misses J2, J4 and J5, UP only J2.
FIG4 = [('J1', 3.0, 2), ('J2', 6.0, 4), ('J3', 10.0, 2), ('J4', 12.0, 7), ('J5', 22.0, 8)]


def fig4_goals():
    return [goal(name, deadline, u) for name, deadline, u in FIG4]


def test_fig4_outcome_of_hpf_luf_and_up():
    assert run_all(EdfPolicy(), fig4_goals())[1] == ['J4', 'J5']
    assert sorted(run_all(LeastUncertaintyFirst(), fig4_goals())[1]) == ['J2', 'J4', 'J5']
    order, missed = run_all(UncertaintyPriority(alpha=1.0, n_max_tokens=10), fig4_goals())
    assert missed == ['J2']
    assert order[:2] == ['J1', 'J3']  # the short J3 goes before the long J2 that would miss


def test_fifo_orders_by_receipt_and_breaks_ties_by_queue_position():
    goals = [goal('b', 5.0, 1, received_s=2.0), goal('a', 9.0, 9, received_s=1.0),
             goal('c', 1.0, 1, received_s=2.0)]
    assert run_all(FifoPolicy(), goals)[0] == ['a', 'b', 'c']


def test_edf_luf_muf():
    goals = [goal('late-short', 50.0, 1), goal('soon-long', 20.0, 9), goal('mid', 30.0, 5)]
    assert run_all(EdfPolicy(), goals)[0] == ['soon-long', 'mid', 'late-short']
    assert run_all(LeastUncertaintyFirst(), goals)[0] == ['late-short', 'mid', 'soon-long']
    assert run_all(MostUncertaintyFirst(), goals)[0] == ['soon-long', 'mid', 'late-short']


def test_slack_is_eq2_and_puts_goals_that_cannot_fit_last():
    # zeta = d - now - t^: a (10 - 8 = 2), b (6 - 1 = 5), c (3 - 5 < 0: will miss anyway).
    goals = [goal('b', 6.0, 1), goal('a', 10.0, 8), goal('c', 3.0, 5)]
    assert SlackPolicy().key(goals[2], 0.0) == (1, 3.0)
    assert goals[SlackPolicy().select(goals, 0.0)].name == 'a'
    # After a (8 s) neither b nor c can fit: they follow in deadline order.
    assert run_all(SlackPolicy(), goals)[0] == ['a', 'c', 'b']


def test_slack_is_recomputed_at_each_choice():
    policy = SlackPolicy()
    goals = [goal('x', 10.0, 2), goal('y', 9.0, 4)]  # zeta 8 and 5 at t = 0
    assert goals[policy.select(goals, 0.0)].name == 'y'
    assert goals[policy.select(goals, 6.0)].name == 'x'  # y's slack is gone: it runs last


def test_up_alpha_zero_is_least_slack_and_alpha_weighs_uncertainty():
    goals = [goal('long-urgent', 12.0, 8), goal('short-relaxed', 14.0, 2)]
    # zeta: 4 and 12. Least slack first runs the long one; UP (alpha 1, N_max 10) divides
    # the slack by 1 - u/N_max: 4 / 0.2 = 20 against 12 / 0.8 = 15 -> the short one first.
    assert run_all(UncertaintyPriority(alpha=0.0, n_max_tokens=10), goals)[0][0] == \
        'long-urgent'
    assert run_all(UncertaintyPriority(alpha=1.0, n_max_tokens=10), goals)[0][0] == \
        'short-relaxed'


def test_up_priority_units_and_edge_cases():
    policy = UncertaintyPriority(alpha=1.0, n_max_tokens=100)
    job = goal('j', 20.0, 50, time_per_token_s=0.1)  # t^ = 5 s, zeta = 15 s at t = 0
    assert policy.priority(job, 0.0) == pytest.approx((1 - 0.5) / 15.0)
    assert policy.priority(goal('full', 20.0, 400, time_per_token_s=0.01), 0.0) == 0.0
    assert policy.priority(job, 16.0) == 0.0  # no slack left
    assert policy.key(job, 16.0) == (1, 20.0)
    for bad in (-1.0, 'x', True):
        with pytest.raises(ValueError):
            UncertaintyPriority(alpha=bad)
    with pytest.raises(ValueError):
        UncertaintyPriority(n_max_tokens=0)


def test_policy_from_config_and_bad_names():
    for name, cls in (('fifo', FifoPolicy), ('edf', EdfPolicy), ('luf', LeastUncertaintyFirst),
                      ('muf', MostUncertaintyFirst), ('slack', SlackPolicy),
                      ('up', UncertaintyPriority)):
        policy = make_scheduler_policy(ServerConfig(scheduler=SchedulerConfig(policy=name)))
        assert isinstance(policy, cls) and policy.name == name
    up = make_scheduler_policy(ServerConfig(scheduler=SchedulerConfig(policy='up',
                                                                      up_alpha=0.5)))
    assert up.alpha == 0.5 and up.n_max_tokens == ServerConfig().engine.max_new_tokens == 256
    with pytest.raises(ValueError, match='scheduler.policy'):
        SchedulerConfig(policy='lottery')
    with pytest.raises(ValueError, match='scheduler.uncertainty'):
        SchedulerConfig(uncertainty='oracle')
    with pytest.raises(ValueError, match='scheduler.up_alpha'):
        SchedulerConfig(up_alpha=-1.0)


class _LengthOfPrompt:
    """A length predictor for the tau test: N^ = characters of the prompt, capped."""

    name = 'rlp'

    def predict(self, prompt, input_ids, n_max):
        return min(n_max, len(prompt))


def test_offload_tau_is_the_quantile_of_training_predictions_stored_at_export(tmp_path):
    import os

    import numpy as np

    from timebill_ros.predictors.threshold import offload_threshold, write_train_lengths
    from timebill_ros.training.export import train_prompts
    model_file = tmp_path / 'rlp.onnx'
    model_file.write_bytes(b'stand-in for the ONNX file: only its size and mtime are read')
    prompts = train_prompts(40)
    assert len(prompts) == 40
    # What the export stores: N^ read without N_max (None = the top bucket, ">= N_model").
    stored = [_LengthOfPrompt().predict(p, [], float('inf')) for p in prompts] + [None]
    write_train_lengths(model_file, stored)
    tau = offload_threshold(_LengthOfPrompt(), 0.9, 512, str(model_file), log=lambda line: None)
    capped = [min(512, len(p)) for p in prompts] + [512]
    assert tau == pytest.approx(np.quantile(capped, 0.9))
    # A re-exported file (another size or mtime) makes the stored predictions stale.
    os.utime(model_file, ns=(0, 0))
    assert offload_threshold(_LengthOfPrompt(), 0.9, 512, str(model_file),
                             log=lambda line: None) == float('inf')
    assert offload_threshold(_LengthOfPrompt(), 0.9, 512, str(tmp_path / 'missing.onnx'),
                             log=lambda line: None) == float('inf')
    with pytest.raises(ValueError, match='quantile'):
        offload_threshold(_LengthOfPrompt(), 1.0, 512)


@pytest.mark.parametrize('saved', [[1, 2], {'n_hat_tokens': [1, 'x']},
                                   {'n_hat_tokens': []}, {'n_hat_tokens': [3, -1]},
                                   {'n_hat_tokens': 'abc'}, {'n_hat_tokens': [True]}, 'text'])
def test_malformed_training_predictions_offload_nothing_and_say_why(tmp_path, saved):
    """A hand-edited or truncated lengths file: tau = infinity, logged, never an exception."""
    import json

    from timebill_ros.predictors.threshold import _stamp, lengths_path, offload_threshold
    model_file = tmp_path / 'rlp.onnx'
    model_file.write_bytes(b'stand-in')
    if isinstance(saved, dict):
        saved = dict(saved, stamp=_stamp(model_file))
    lengths_path(model_file).write_text(json.dumps(saved))
    lines = []
    assert offload_threshold(_LengthOfPrompt(), 0.9, 512, str(model_file),
                             log=lines.append) == float('inf')
    assert any('no training predictions' in line for line in lines), lines


def test_the_fallback_predictor_offloads_nothing():
    from timebill_ros.predictors import FallbackPredictor
    from timebill_ros.predictors.threshold import offload_threshold
    assert offload_threshold(FallbackPredictor(), 0.9, 128,
                             log=lambda line: None) == float('inf')


def test_offload_config_is_checked():
    from timebill_ros.config import OffloadConfig
    with pytest.raises(ValueError, match='offload.quantile'):
        OffloadConfig(quantile=1.0)
    with pytest.raises(ValueError, match='offload.threads'):
        OffloadConfig(threads=0)
    with pytest.raises(TypeError, match='offload.enabled'):
        OffloadConfig(enabled='yes')
