"""Consolidation (RT-LM Alg. 1, adapted): the batch cut, its parameters, the batched step."""

import types

import pytest

from timebill_ros.config import SchedulerConfig
from timebill_ros.server.scheduler import EdfPolicy, FifoPolicy
from timebill_ros.server.scheduler.consolidation import cut_batch
from timebill_ros.timing.batch import BatchStepCoefficients, ScaledSteps, step_scale
from timebill_ros.timing.model import TimingCoefficients
from timebill_ros.timing.online import TimeModel


def _jobs(lengths, deadlines=None):
    """Goals received at t = 0, 1, 2, ... with u_J = ``lengths`` (tokens)."""
    deadlines = deadlines or [100.0] * len(lengths)
    return [types.SimpleNamespace(received_s=float(i), deadline_s=d, uncertainty_tokens=u)
            for i, (u, d) in enumerate(zip(lengths, deadlines))]


def test_the_batch_grows_from_the_first_choice_while_lengths_stay_close():
    jobs = _jobs([10, 12, 40, 11, 100])
    # Sorted by u_J: 10 (goal 0), 11 (3), 12 (1), 40 (2), 100 (4). From goal 0: 11 and 12
    # are within 1.5x of their neighbour, 40 > 1.5 x 12 cuts.
    assert cut_batch(jobs, 0.0, FifoPolicy(), 4, 2.0, 1.5) == [0, 1, 3]
    assert cut_batch(jobs, 0.0, FifoPolicy(), 2, 2.0, 1.5) == [0, 3]  # C_f = 2
    assert cut_batch(jobs, 0.0, FifoPolicy(), 8, 2.0, 10.0) == [0, 1, 2, 3, 4]
    assert cut_batch(jobs, 0.0, FifoPolicy(), 4, 2.0, 1.0) == [0]  # only equal lengths join


def test_only_the_b_x_cf_goals_of_highest_priority_are_candidates():
    jobs = _jobs([10, 40, 11, 12])
    # b x C_f = 2 candidates: goals 0 and 1 (fifo); 40 is too far from 10: alone.
    assert cut_batch(jobs, 0.0, FifoPolicy(), 2, 1.0, 1.5) == [0]
    assert cut_batch(jobs, 0.0, FifoPolicy(), 2, 2.0, 1.5) == [0, 2]
    assert cut_batch(jobs, 0.0, FifoPolicy(), 1, 10.0, 10.0) == [0]  # C_f = 1: no batching


def test_the_policys_first_choice_is_always_in_the_batch_and_grows_both_ways():
    # EDF: goal 2 (u 20) is due first; neighbours 15 (goal 1, due later) and 25 (goal 3,
    # due sooner than goal 1): the sooner-due neighbour joins first, then the other.
    jobs = _jobs([5, 15, 20, 25, 80], deadlines=[50.0, 40.0, 10.0, 30.0, 20.0])
    assert cut_batch(jobs, 0.0, EdfPolicy(), 2, 3.0, 1.5) == [2, 3]
    assert cut_batch(jobs, 0.0, EdfPolicy(), 3, 3.0, 1.5) == [2, 3, 1]
    # A zero-length prediction counts as one token (a ratio to 0 is undefined).
    assert cut_batch(_jobs([0, 1, 2]), 0.0, FifoPolicy(), 3, 1.0, 1.5) == [0, 1]


def test_cut_batch_needs_a_job():
    with pytest.raises(ValueError):
        cut_batch([], 0.0, FifoPolicy(), 4, 1.8, 1.5)


@pytest.mark.parametrize('field, value', [('batch_size', 0), ('batch_size', True),
                                          ('batch_size', 2.0), ('b', 0.5), ('b', True),
                                          ('length_ratio', 0.9), ('length_ratio', 'x')])
def test_consolidation_parameters_are_checked(field, value):
    with pytest.raises(ValueError, match=f'scheduler.{field}'):
        SchedulerConfig(**{field: value})


def test_defaults_follow_the_paper():
    config = SchedulerConfig()
    assert not config.consolidation
    assert (config.batch_size, config.b, config.length_ratio) == (4, 1.8, 1.5)


def test_step_scale_from_the_batched_step_fit():
    fit = BatchStepCoefficients(q=0.020, r=0.002, p=1e-6)
    assert step_scale(fit, 1) == 1.0
    # B = 4: t(4, 4n) / t(1, n), largest over n = 128 and 1024 tokens a goal.
    expected = max((0.020 + 3 * 0.002 + 4 * n * 1e-6) / (0.020 + n * 1e-6) for n in (128, 1024))
    assert step_scale(fit, 4) == pytest.approx(expected)
    assert 1.0 < step_scale(fit, 4) < 4.0  # batching pays: a goal's step is not 4x longer
    assert step_scale(None, 4) == 4.0  # no fit: no gain assumed
    with pytest.raises(ValueError):
        step_scale(fit, 0)


def test_scaled_steps_scale_only_the_decoding_phase():
    model = TimeModel(TimingCoefficients(a=1e-9, b=1e-5, c=1e-3, p=1e-6, q=1e-3))
    scaled = ScaledSteps(model, 2.5)
    assert scaled.step_s(100) == pytest.approx(2.5 * model.step_s(100))
    assert scaled.decode_s(100, 0.2, 10) == pytest.approx(2.5 * model.decode_s(100, 0.2, 10))
    co, base = scaled.decode_coefficients(), model.decode_coefficients()
    assert (co.p, co.q) == pytest.approx((2.5 * base.p, 2.5 * base.q))
    assert (co.a, co.b, co.c) == (base.a, base.b, base.c)
    assert scaled.prefill_s(100) == model.prefill_s(100)
    assert scaled.evict_s(100) == model.evict_s(100)
    with pytest.raises(ValueError):
        ScaledSteps(model, 0.0)


def test_joining_a_decoding_batch_takes_priority_order_and_similar_lengths():
    from timebill_ros.server.scheduler.consolidation import join_batch
    jobs, members = _jobs([14, 16, 5, 30]), _jobs([10])
    assert join_batch(jobs, 0.0, FifoPolicy(), 4, members) == [0, 1, 2, 3]
    assert join_batch(jobs, 0.0, FifoPolicy(), 2, members) == [0, 1]
    assert join_batch(jobs, 0.0, FifoPolicy(), 0, members) == []
    # With lambda = 1.5 only u_J within 1.5x of a member's (10, or 28 when it is there).
    assert join_batch(jobs, 0.0, FifoPolicy(), 4, members, 1.5) == [0]
    assert join_batch(jobs, 0.0, FifoPolicy(), 4, _jobs([10, 28]), 1.5) == [0, 3]
