"""Consolidation (RT-LM Alg. 1, adapted): the batch cut, its parameters, the batched step."""

import types

import pytest

from timebill_ros.config import SchedulerConfig, ServerConfig
from timebill_ros.server.backends.local import build_batch_step
from timebill_ros.server.scheduler import EdfPolicy, FifoPolicy
from timebill_ros.server.scheduler.consolidation import cut_batch, keep_on_time
from timebill_ros.server.service import TimeBillService
from timebill_ros.timing.batch import (BatchScale, BatchStepCoefficients, ScaledSteps,
                                       choose_batch_size, step_scale)
from timebill_ros.paths import CACHE_ENV
from timebill_ros.timing.model import Calibration, TimingCoefficients, default_calibration_path
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


@pytest.mark.parametrize('field, value', [('batch_size', -1), ('batch_size', True),
                                          ('batch_size', 2.0), ('b', 0.5), ('b', True),
                                          ('length_ratio', 0.9), ('length_ratio', 'x'),
                                          ('batch_gain', 0), ('batch_gain', 1.0),
                                          ('batch_gain', True)])
def test_consolidation_parameters_are_checked(field, value):
    with pytest.raises(ValueError, match=f'scheduler.{field}'):
        SchedulerConfig(**{field: value})


def test_defaults_follow_the_paper():
    config = SchedulerConfig()
    assert not config.consolidation
    assert (config.batch_size, config.b, config.length_ratio) == (4, 1.8, 1.5)
    assert SchedulerConfig(batch_size=0).batch_size == 0  # chosen at start-up


def test_batch_size_is_chosen_where_the_per_token_cost_stops_falling():
    # Per-token cost (q - r) / B + r + p n: 30, 16, 9, 5.5, 3.75 ms at B = 1..16 (p = 0).
    fit = BatchStepCoefficients(q=0.030, r=0.002, p=0.0)
    sizes = (1, 2, 4, 8, 16)
    assert choose_batch_size(fit, sizes, 0.1) == 16  # every doubling still saves > 10 %
    assert choose_batch_size(fit, sizes, 0.35) == 8  # 8 -> 16 saves 32 %
    assert choose_batch_size(fit, sizes, 0.45) == 2  # 2 -> 4 saves 44 %
    assert choose_batch_size(fit, (1, 2), 0.1) == 2  # never past the probed sizes
    # A flat per-token cost (each goal adds a full step): batching never pays.
    assert choose_batch_size(BatchStepCoefficients(q=0.03, r=0.03, p=0.0), sizes, 0.1) == 1
    with pytest.raises(ValueError, match='gain_share'):
        choose_batch_size(fit, sizes, 0.0)
    with pytest.raises(ValueError, match='sizes'):
        choose_batch_size(fit, (), 0.1)


def _calibration(batch_points=()):
    return Calibration(
        coefficients=TimingCoefficients(a=0.0, b=1e-3, c=0.01, p=1e-6, q=0.03),
        model_key='tiny', device='cpu', dtype='float32', threads=0, prefill_mape_pct=None,
        decode_mape_pct=None, n_points=0, profiling_s=0.0,
        created='2026-11-24T00:00:00+00:00', method='few_shot', prefill_points=(),
        decode_points=(), batch_points=batch_points)


POINTS = ((1, 129, 0.030), (2, 258, 0.032), (4, 516, 0.036), (8, 1032, 0.044),
          (1, 1025, 0.034), (2, 2050, 0.040), (4, 4100, 0.052), (8, 8200, 0.076))


def test_the_factory_resolves_batch_size_zero_from_the_calibration(make_tiny_engine):
    engine = make_tiny_engine()
    config = ServerConfig(scheduler=SchedulerConfig(continuous=True, batch_size=0))
    log = []
    fit, resolved = build_batch_step(config, engine, _calibration(POINTS), log.append)
    assert fit is not None and fit.r > 0
    assert resolved.scheduler.batch_size == choose_batch_size(fit, (1, 2, 4, 8), 0.1)
    assert any('C_f =' in line for line in log)
    # Nothing batches: no fit needed, and C_f 0 means one goal at a time.
    fit, resolved = build_batch_step(ServerConfig(scheduler=SchedulerConfig(batch_size=0)),
                                     engine, _calibration(), log.append)
    assert fit is None and resolved.scheduler.batch_size == 1


def test_probed_batch_points_are_cached_with_the_calibration(make_tiny_engine, tmp_path,
                                                             monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    engine = make_tiny_engine()
    calibration = _calibration()
    config = ServerConfig(scheduler=SchedulerConfig(consolidation=True))
    fit, resolved = build_batch_step(config, engine, calibration, lambda line: None)
    assert fit is not None and resolved.scheduler.batch_size == 4
    saved = Calibration.load(default_calibration_path(calibration.key))
    assert {b for b, _, _ in saved.batch_points} == {1, 2, 4, 8}


def test_the_service_refuses_an_unresolved_batch_size(make_tiny_engine):
    config = ServerConfig(scheduler=SchedulerConfig(continuous=True, batch_size=0))
    with pytest.raises(ValueError, match='batch_size 0'):
        TimeBillService(config, make_tiny_engine(), None, None)


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


def _due(deadline_s, n_x=100, tokens=50):
    return types.SimpleNamespace(deadline_s=deadline_s, n_x=n_x, tokens=tokens)


def test_a_goal_joins_only_while_every_member_stays_on_time():
    # prefill 1 s each, decoding alone 10 s each, a batch of B makes each step 1 + (B-1)/2 x.
    prefill, decode = (lambda job: 1.0), (lambda job: 0.2 * job.tokens)
    scale = (lambda size: 1.0 + (size - 1) / 2)
    jobs = [_due(30.0), _due(30.0), _due(30.0), _due(30.0)]
    # B = 2: 2 + 1.5 x 10 = 17; B = 3: 3 + 20 = 23; B = 4: 4 + 25 = 29 <= 30: all four.
    assert keep_on_time(jobs, 0.0, prefill, decode, scale) == [0, 1, 2, 3]
    # The second goal's deadline allows a pair, not a triple: the third and fourth wait.
    jobs[1] = _due(20.0)
    assert keep_on_time(jobs, 0.0, prefill, decode, scale) == [0, 1]
    # A goal that fits alone (11 s) but not in any batch stays first and alone.
    jobs = [_due(12.0), _due(60.0), _due(60.0)]
    assert keep_on_time(jobs, 0.0, prefill, decode, scale) == [0]
    # One late even alone (deadline 5 s) does not keep the others out; time passes too.
    jobs = [_due(60.0), _due(5.0), _due(60.0)]
    assert keep_on_time(jobs, 0.0, prefill, decode, scale) == [0, 1, 2]
    assert keep_on_time(jobs, 40.0, prefill, decode, scale) == [0, 1]
    with pytest.raises(ValueError):
        keep_on_time([], 0.0, prefill, decode, scale)


def test_the_batch_scale_rises_to_what_batches_showed_and_never_below_the_fit():
    fit = BatchStepCoefficients(q=0.020, r=0.002, p=1e-6)
    scale = BatchScale(fit, weight=0.5)
    assert scale.scale(1) == 1.0 and scale.scale(4) == step_scale(fit, 4)
    scale.observe(4, 2.0)  # the first observation is taken as it is
    assert scale.scale(4) == 2.0 and scale.scale(2) == step_scale(fit, 2)
    scale.observe(4, 3.0)  # then an average with weight 0.5
    assert scale.scale(4) == pytest.approx(2.5)
    scale.observe(4, 0.1)
    scale.observe(4, 0.1)
    assert scale.scale(4) == step_scale(fit, 4)  # faster than the fit: the fit stands
    scale.observe(1, 5.0)  # a step alone is not a batch
    scale.observe(4, float('nan'))
    assert 1 not in scale.learned and scale.learned[4] == pytest.approx(0.7)
    assert BatchScale(None).scale(3) == 3.0  # no fit, nothing seen: B x
    with pytest.raises(ValueError, match='weight'):
        BatchScale(fit, weight=0.0)
