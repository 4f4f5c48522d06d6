"""The self-correcting time model (timing/online.py): speed factors, residual margins, state."""

import math
import os
import threading

import numpy as np
import pytest

from timebill_ros.timing.model import TimingCoefficients
from timebill_ros.timing.online import (DECODE, EVICT, EVICT_PRIOR_S_PER_TOKEN, EXPECTED,
                                        LEAST, OnlineSettings, PhaseTracker, PREDICT, PREFILL,
                                        TimeModel, WORST)

# Round numbers: prefill(100) = 1e-5 * 1e4 + 1e-2 * 100 + 0.5 = 1.6 s; step(100) = 0.11 s.
CO = TimingCoefficients(a=1e-5, b=1e-2, c=0.5, p=1e-3, q=0.01)


def predictor_base_s(n_x):
    """Return a calibrated t^_Predict: 0.2 s plus 1 ms per prompt token."""
    return 0.2 + 1e-3 * n_x


def simulate(ratios, gain):
    """Return (log factor, residuals) of the documented update, written out independently.

    The factor starts at the calibration (log 0); a ratio above it is adopted at once, one
    below it moves log f by ``gain``; every sample after the first leaves a residual.
    """
    log_f, residuals = 0.0, []
    for k, ratio in enumerate(ratios):
        if k:
            residuals.append(ratio / math.exp(log_f))
        if math.log(ratio) > log_f:
            log_f = math.log(ratio)
        else:
            log_f = log_f + gain * (math.log(ratio) - log_f)
    return log_f, residuals


# --- PhaseTracker updates --------------------------------------------------------------
def test_first_observation_sets_factor_and_adds_no_residual():
    tracker = PhaseTracker(OnlineSettings())
    assert tracker.factor == 1.0 and tracker.n_samples == 0
    tracker.observe(2.0, 3.0)  # slower than calibrated: adopted at once
    assert tracker.factor == pytest.approx(1.5, rel=1e-15)
    assert tracker.log_factor == math.log(1.5)
    assert list(tracker.residuals) == []
    assert tracker.n_samples == 1


def test_a_first_speed_up_is_believed_only_in_part():
    tracker = PhaseTracker(OnlineSettings(speed_gain=0.3))
    tracker.observe(1.0, 0.5)  # twice as fast as calibrated
    assert tracker.log_factor == pytest.approx(0.3 * math.log(0.5), rel=1e-15)
    assert tracker.factor == pytest.approx(0.5 ** 0.3, rel=1e-14)
    assert list(tracker.residuals) == [] and tracker.n_samples == 1


def test_slow_downs_are_adopted_at_once_speed_ups_by_gain():
    tracker = PhaseTracker(OnlineSettings(speed_gain=0.5))
    tracker.observe(1.0, 2.0)  # log f = ln 2, f = 2
    tracker.observe(1.0, 1.0)  # residual 1 / 2; faster: log f = ln2 + 0.5 (0 - ln2)
    assert tracker.log_factor == pytest.approx(0.5 * math.log(2.0), rel=1e-14)
    assert tracker.factor == pytest.approx(math.sqrt(2.0), rel=1e-14)
    tracker.observe(1.0, 4.0)  # residual 4 / sqrt2; slower: f = 4 at once
    assert tracker.log_factor == pytest.approx(2.0 * math.log(2.0), rel=1e-14)
    assert tracker.factor == pytest.approx(4.0, rel=1e-14)
    assert list(tracker.residuals) == pytest.approx([0.5, 2.0 * math.sqrt(2.0)], rel=1e-14)
    assert tracker.n_samples == 3


def test_residual_is_ratio_over_factor_before_update_default_gain():
    tracker = PhaseTracker(OnlineSettings())  # gain 0.3
    ratios = [1.2, 0.9, 1.5, 1.1, 0.7]
    for ratio in ratios:
        tracker.observe(0.5, 0.5 * ratio)
    log_f, residuals = simulate(ratios, 0.3)
    assert tracker.log_factor == pytest.approx(log_f, rel=1e-12)
    assert list(tracker.residuals) == pytest.approx(residuals, rel=1e-12)
    # The second residual by hand: 0.9 / 1.2 = 0.75.
    assert tracker.residuals[0] == pytest.approx(0.75, rel=1e-12)


# --- bounds ----------------------------------------------------------------------------
def test_expected_is_factor_times_calibrated():
    model = TimeModel(CO)
    model.observe_prefill(100, 2 * 1.6)
    model.observe_decode(100, 8, 3 * CO.decode_phase_s(100, 0.0, 9))
    assert model.prefill_s(100) == pytest.approx(2 * 1.6, rel=1e-12)
    assert model.prefill_s(50, EXPECTED) == pytest.approx(2 * CO.prefill_s(50), rel=1e-12)
    assert model.step_s(100) == pytest.approx(3 * 0.11, rel=1e-12)
    assert model.step_s(10) == pytest.approx(3 * (1e-3 * 10 + 0.01), rel=1e-12)


def test_bounds_with_few_residuals_use_prior_margin():
    model = TimeModel(CO)  # prior_margin 1.3, min_residuals 8
    # No residuals at all: margins are the prior (and its inverse).
    assert model.prefill_s(100, WORST) == pytest.approx(1.3 * 1.6, rel=1e-12)
    assert model.prefill_s(100, LEAST) == pytest.approx(1.6 / 1.3, rel=1e-12)
    status = model.status(PREFILL)
    assert status.upper_margin == 1.3 and status.lower_margin == pytest.approx(1 / 1.3)
    # Residuals inside [1/1.3, 1.3]: the prior still rules.
    tracker = model.phases[PREFILL]
    for ratio in (1.0, 1.1, 1.0):  # residuals 1.1 and 1 / 1.1
        model.observe_prefill(100, 1.6 * ratio)
    assert len(tracker.residuals) == 2
    assert tracker.margin(WORST) == 1.3
    assert tracker.margin(LEAST) == pytest.approx(1 / 1.3, rel=1e-15)
    # Residuals beyond the prior: the largest / smallest seen win.
    gained = PhaseTracker(OnlineSettings(speed_gain=0.5))
    for ratio in (2.0, 1.0, 4.0):  # residuals 0.5 and 2 sqrt 2
        gained.observe(1.0, ratio)
    assert gained.margin(WORST) == pytest.approx(2.0 * math.sqrt(2.0), rel=1e-14)
    assert gained.margin(LEAST) == pytest.approx(0.5, rel=1e-14)
    assert gained.margin(EXPECTED) == 1.0


def test_decide_bound_takes_the_decision_quantile_capped_at_the_wcet_one():
    settings = OnlineSettings(residual_window=10, wcet_quantile=0.99, decision_quantile=0.6,
                              min_residuals=4)
    tracker = PhaseTracker(settings)
    tracker.observe(1.0, 1.0)  # the first sample sets the factor, no residual
    for residual in (0.9, 1.0, 1.1, 1.2, 1.3, 1.5, 2.0):
        tracker.log_factor = 0.0  # residual = measured / calibrated
        tracker.observe(1.0, residual)
    window = np.array(tracker.residuals)
    assert tracker.margin('decide') == float(np.quantile(window, 0.6, method='higher'))
    assert tracker.margin('decide') == 1.3 and tracker.margin(WORST) == 2.0
    capped = PhaseTracker(OnlineSettings(wcet_quantile=0.6, decision_quantile=0.99,
                                         min_residuals=4))
    capped.residuals.extend(window)
    assert capped.margin('decide') == capped.margin(WORST) == 1.3
    with pytest.raises(ValueError, match='decision_quantile'):
        OnlineSettings(decision_quantile=0.4)


def test_bounds_with_enough_residuals_use_quantiles():
    settings = OnlineSettings(speed_gain=0.3, residual_window=10, wcet_quantile=0.9,
                              min_residuals=4, prior_margin=1.3)
    model = TimeModel(CO, settings)
    ratios = [1.0, 1.2, 0.8, 1.05, 1.6, 0.95, 1.1, 0.7, 1.3, 1.0, 0.9, 1.25, 1.15, 0.85, 1.4]
    for ratio in ratios:
        model.observe_prefill(100, 1.6 * ratio)
    log_f, residuals = simulate(ratios, 0.3)
    window = np.array(residuals[-10:])
    tracker = model.phases[PREFILL]
    assert list(tracker.residuals) == pytest.approx(list(window), rel=1e-12)
    worst = max(1.0, float(np.quantile(window, 0.9, method='higher')))
    least = min(1.0, float(np.quantile(window, 0.1, method='lower')))
    assert worst > 1.0 and least < 1.0  # the quantiles, not the clamps, decide here
    assert worst != pytest.approx(1.3) and least != pytest.approx(1 / 1.3)
    factor = math.exp(log_f)
    assert model.prefill_s(100, WORST) == pytest.approx(factor * worst * 1.6, rel=1e-12)
    assert model.prefill_s(100, LEAST) == pytest.approx(factor * least * 1.6, rel=1e-12)
    assert model.prefill_s(100) == pytest.approx(factor * 1.6, rel=1e-12)
    status = model.status(PREFILL)
    assert status.upper_margin == pytest.approx(worst, rel=1e-12)
    assert status.lower_margin == pytest.approx(least, rel=1e-12)
    assert status.n_samples == len(ratios)


def test_quantile_margins_are_clamped_at_one():
    settings = OnlineSettings(speed_gain=1.0, min_residuals=2)
    # Gain 1: the factor becomes each ratio, so residuals are ratio_k / ratio_{k-1}.
    shrinking = PhaseTracker(settings)
    for ratio in (1.0, 0.9, 0.81, 0.729):  # every residual 0.9
        shrinking.observe(1.0, ratio)
    assert list(shrinking.residuals) == pytest.approx([0.9, 0.9, 0.9], rel=1e-12)
    assert shrinking.margin(WORST) == 1.0
    assert shrinking.margin(LEAST) == pytest.approx(0.9, rel=1e-12)
    growing = PhaseTracker(settings)
    for ratio in (1.0, 1.1, 1.21):  # residuals 1.1
        growing.observe(1.0, ratio)
    assert growing.margin(LEAST) == 1.0
    assert growing.margin(WORST) == pytest.approx(1.1, rel=1e-12)


def test_disabled_is_the_fixed_model():
    model = TimeModel(CO, OnlineSettings(enabled=False), predict_s=predictor_base_s)
    for measured in (5.0, 0.1, 9.0, 3.0):
        model.observe_prefill(100, measured)
        model.observe_decode(100, 8, measured)
        model.observe_predict(100, measured)
    for bound in (EXPECTED, WORST, LEAST):
        assert model.prefill_s(100, bound) == pytest.approx(1.6, rel=1e-15)
        assert model.step_s(100, bound) == pytest.approx(0.11, rel=1e-15)
        assert model.predict_s(100, bound) == pytest.approx(0.3, rel=1e-15)
    for phase in (PREFILL, DECODE, PREDICT):
        status = model.status(phase)
        assert (status.speed_factor, status.upper_margin, status.lower_margin) == (1, 1, 1)
        assert status.n_samples == 4


def test_drifting_machine_is_tracked():
    model = TimeModel(CO)  # gain 0.3
    decode_base = CO.decode_phase_s(100, 0.0, 11)
    for _ in range(10):
        model.observe_prefill(100, 1.6)
        model.observe_decode(100, 10, decode_base)
    assert model.status(PREFILL).speed_factor == pytest.approx(1.0, rel=1e-12)
    # The machine slows to 1.5x: the first slow goal sets the factor.
    model.observe_prefill(100, 1.5 * 1.6)
    model.observe_decode(100, 10, 1.5 * decode_base)
    for phase in (PREFILL, DECODE):
        assert model.status(phase).speed_factor == pytest.approx(1.5, rel=1e-12)
    assert model.prefill_s(200) == pytest.approx(1.5 * CO.prefill_s(200), rel=1e-12)
    assert model.step_s(300) == pytest.approx(1.5 * (0.3 + 0.01), rel=1e-12)
    assert model.decode_s(100, 0.5, 20) == pytest.approx(
        1.5 * CO.decode_phase_s(100, 0.5, 20), rel=1e-12)
    # It speeds up again: log f = ln 1.5 x 0.7^k after k goals at 1.0.
    for _ in range(20):
        model.observe_prefill(100, 1.6)
        model.observe_decode(100, 10, decode_base)
    expected_factor = 1.5 ** (0.7 ** 20)
    for phase in (PREFILL, DECODE):
        factor = model.status(phase).speed_factor
        assert factor == pytest.approx(expected_factor, rel=1e-12)
        assert abs(factor - 1.0) < 0.001


# --- the estimates ---------------------------------------------------------------------
def test_prefill_rest_ends():
    model = TimeModel(CO)
    model.observe_prefill(100, 2.0)
    for bound in (EXPECTED, WORST, LEAST):
        assert model.prefill_rest_s(0, 100, bound) == model.prefill_s(100, bound)


def test_prefill_rest_of_a_finished_prefill_is_zero():
    # Nothing is left once all n_x tokens are prefilled (no forward pass, no constant c).
    model = TimeModel(CO)
    assert model.prefill_rest_s(100, 100) == 0.0
    assert model.prefill_rest_s(100, 100, WORST) == 0.0


def test_prefill_rest_midway_and_chunk():
    model = TimeModel(CO)
    model.observe_prefill(100, 3.2)  # factor 2
    # Rest of 40..100: a (100^2 - 40^2) + b 60 + c = 0.084 + 0.6 + 0.5 = 1.184 s, times 2.
    assert model.prefill_rest_s(40, 100) == pytest.approx(2 * 1.184, rel=1e-12)
    # Chunk of 30 tokens from 40: a (70^2 - 40^2) + b 30 + c = 0.033 + 0.3 + 0.5, times 2.
    assert model.chunk_s(40, 30) == pytest.approx(2 * 0.833, rel=1e-12)
    assert model.chunk_s(0, 100) == pytest.approx(model.prefill_s(100), rel=1e-12)
    assert model.chunk_s(40, 30, WORST) == pytest.approx(2 * 1.3 * 0.833, rel=1e-12)


def test_decode_s_and_decode_coefficients():
    model = TimeModel(CO)
    model.observe_decode(100, 8, 2 * CO.decode_phase_s(100, 0.0, 9))  # factor 2
    # 19 steps from 50 kept tokens: 19 (0.05 + 0.01) + 1e-3 19 18 / 2 = 1.311 s.
    assert CO.decode_phase_s(100, 0.5, 20) == pytest.approx(1.311, rel=1e-12)
    assert model.decode_s(100, 0.5, 20) == pytest.approx(2 * 1.311, rel=1e-12)
    assert model.decode_s(100, 0.5, 20, WORST) == pytest.approx(2 * 1.3 * 1.311, rel=1e-12)
    worst = model.decode_coefficients(WORST)
    assert (worst.a, worst.b, worst.c) == (CO.a, CO.b, CO.c)
    assert worst.p == pytest.approx(2 * 1.3 * CO.p, rel=1e-12)
    assert worst.q == pytest.approx(2 * 1.3 * CO.q, rel=1e-12)
    assert model.decode_coefficients().p == worst.p  # WORST by default
    least = model.decode_coefficients(LEAST)
    assert least.q == pytest.approx(2 / 1.3 * CO.q, rel=1e-12)
    with pytest.raises(ValueError, match='bound'):
        model.decode_coefficients('typical')


def test_overhang_pairs_opposite_bounds():
    model = TimeModel(CO, predict_s=predictor_base_s)
    model.observe_predict(100, 3.0)  # predictor factor 10: 3.0 s expected at 100 tokens
    assert model.predict_s(100) == pytest.approx(3.0, rel=1e-12)
    # WORST: 1.3 x 3.0 predictor against the fastest prefill 1.6 / 1.3.
    assert model.overhang_s(100, WORST) == pytest.approx(3.9 - 1.6 / 1.3, rel=1e-12)
    assert model.overhang_s(100, LEAST) == pytest.approx(3.0 / 1.3 - 1.6 * 1.3, rel=1e-12)
    assert model.overhang_s(100) == pytest.approx(3.0 - 1.6, rel=1e-12)
    # A predictor shorter than the prefill is hidden entirely.
    assert TimeModel(CO, predict_s=predictor_base_s).overhang_s(100, EXPECTED) == 0.0
    no_predictor = TimeModel(CO)
    assert no_predictor.predict_s(100, WORST) == 0.0
    assert no_predictor.overhang_s(100, WORST) == 0.0


def test_least_e2e():
    model = TimeModel(CO, predict_s=predictor_base_s)
    model.observe_predict(100, 3.0)
    expected = (1.6 / 1.3) + (3.0 / 1.3 - 1.6 * 1.3) + (0.11 / 1.3)
    assert model.least_e2e_s(100) == pytest.approx(expected, rel=1e-12)
    assert model.least_e2e_s(100) == pytest.approx(
        model.prefill_s(100, LEAST) + model.overhang_s(100, LEAST)
        + model.step_s(100, LEAST), rel=1e-15)
    assert TimeModel(CO).least_e2e_s(100) == pytest.approx((1.6 + 0.11) / 1.3, rel=1e-12)


def test_evict_estimate():
    model = TimeModel(CO)
    assert model.evict_s(800) == pytest.approx(800 * EVICT_PRIOR_S_PER_TOKEN, rel=1e-15)
    model.observe_evict(800, 0.08)  # 2 x the prior
    assert model.evict_s(400) == pytest.approx(2 * 400 * EVICT_PRIOR_S_PER_TOKEN, rel=1e-12)


@pytest.mark.parametrize('measured', [0.0, -1.0, math.nan, math.inf, -math.inf])
def test_observe_ignores_bad_measurements(measured):
    model = TimeModel(CO, predict_s=predictor_base_s)
    model.observe_prefill(100, measured)
    model.observe_decode(100, 5, measured)
    model.observe_evict(100, measured)
    model.observe_predict(100, measured)
    for phase in (PREFILL, DECODE, EVICT, PREDICT):
        assert model.status(phase).n_samples == 0
        assert model.status(phase).speed_factor == 1.0


def test_observe_ignores_zero_bases():
    zero = TimingCoefficients(0, 0, 0, 0, 0)
    model = TimeModel(zero, predict_s=lambda n_x: 0.0)
    model.observe_prefill(100, 1.0)
    model.observe_decode(100, 5, 1.0)
    model.observe_decode(100, 0, 1.0)
    model.observe_evict(0, 1.0)
    model.observe_predict(100, 1.0)
    for phase in (PREFILL, DECODE, EVICT, PREDICT):
        assert model.status(phase).n_samples == 0
    # Zero steps are ignored even with a non-zero calibration.
    real = TimeModel(CO)
    real.observe_decode(100, 0, 1.0)
    assert real.status(DECODE).n_samples == 0


def test_observe_decode_base_is_the_sum_of_steps():
    model = TimeModel(CO)
    # 8 steps from 100 cached tokens: 8 (0.1 + 0.01) + 1e-3 8 7 / 2 = 0.908 s; measured 2x.
    model.observe_decode(100, 8, 1.816)
    assert model.status(DECODE).speed_factor == pytest.approx(2.0, rel=1e-12)
    # Fewer than MIN_DECODE_STEPS steps are one step's jitter: ignored.
    model.observe_decode(100, 7, 100.0)
    assert model.status(DECODE).n_samples == 1


# --- persistence -----------------------------------------------------------------------
def trained_model(created='2024-01-01T00:00:00'):
    """Return a TimeModel with several samples in every phase."""
    model = TimeModel(CO, predict_s=predictor_base_s, calibration_created=created)
    for i, ratio in enumerate((1.1, 0.9, 1.3, 1.05)):
        model.observe_prefill(100 + i, CO.prefill_s(100 + i) * ratio)
        model.observe_decode(50, 8, 0.5 * ratio)
        model.observe_evict(200, 0.01 * ratio)
        model.observe_predict(100, 0.3 * ratio)
    return model


def test_save_and_load_round_trip(tmp_path):
    model = trained_model()
    path = str(tmp_path / 'state' / 'online.yaml')
    model.save(path)
    assert os.listdir(tmp_path / 'state') == ['online.yaml']  # atomic: no temp left
    fresh = TimeModel(CO, predict_s=predictor_base_s, calibration_created='2024-01-01T00:00:00')
    assert fresh.load(path) is True
    for phase in (PREFILL, DECODE, EVICT, PREDICT):
        assert fresh.phases[phase].log_factor == model.phases[phase].log_factor
        assert list(fresh.phases[phase].residuals) == list(model.phases[phase].residuals)
        assert fresh.status(phase) == model.status(phase)
        assert fresh.status(phase).n_samples == 4
    assert fresh.prefill_s(100, WORST) == model.prefill_s(100, WORST)
    # Saving again over the file leaves one file.
    fresh.save(path)
    assert os.listdir(tmp_path / 'state') == ['online.yaml']


def test_load_of_another_calibration_is_refused(tmp_path):
    path = str(tmp_path / 'online.yaml')
    trained_model('2024-01-01T00:00:00').save(path)
    other = TimeModel(CO, calibration_created='2025-06-01T00:00:00')
    other.observe_prefill(100, 3.2)
    before = other.state()['phases']
    with pytest.raises(ValueError, match='2024-01-01T00:00:00'):
        other.load(path)
    assert other.state()['phases'] == before
    assert other.status(PREFILL).speed_factor == pytest.approx(2.0, rel=1e-12)


def test_load_missing_file_returns_false(tmp_path):
    model = TimeModel(CO)
    assert model.load(str(tmp_path / 'absent.yaml')) is False
    assert model.status(PREFILL).n_samples == 0


@pytest.mark.parametrize('text', [
    'version: 1\nphases: [unclosed\n',   # not YAML
    '- just\n- a list\n',                 # not a mapping
    '',                                   # empty
    "version: 1\ncalibration_created: ''\nphases: {prefill: {log_factor: 0.0}}\n",
])
def test_load_malformed_raises_value_error(tmp_path, text):
    path = tmp_path / 'online.yaml'
    path.write_text(text, encoding='utf-8')
    model = TimeModel(CO)
    model.observe_prefill(100, 3.2)
    with pytest.raises(ValueError):
        model.load(str(path))
    assert model.status(PREFILL).speed_factor == pytest.approx(2.0, rel=1e-12)


# --- settings --------------------------------------------------------------------------
@pytest.mark.parametrize('field, value', [
    ('speed_gain', 0), ('speed_gain', 1.5), ('wcet_quantile', 0.3), ('prior_margin', 0.9),
    ('residual_window', 0),
])
def test_settings_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=f'timing.{field}'):
        OnlineSettings(**{field: value})


def test_settings_edges_are_accepted():
    OnlineSettings(speed_gain=1.0, wcet_quantile=0.5, prior_margin=1.0, residual_window=1,
                   min_residuals=0)


# --- threads ---------------------------------------------------------------------------
def test_concurrent_observations_and_reads():
    model = TimeModel(CO)
    errors = []
    start = threading.Barrier(5)

    def writer(seed):
        try:
            start.wait()
            for i in range(500):
                model.observe_decode(100, 8, 0.9 * (1.0 + 0.01 * ((seed + i) % 7)))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader():
        try:
            start.wait()
            for _ in range(500):
                model.status(DECODE)
                model.step_s(100, WORST)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    threads.append(threading.Thread(target=reader))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    status = model.status(DECODE)
    assert status.n_samples == 2000
    assert len(model.phases[DECODE].residuals) == 64
    assert 1.0 <= status.speed_factor <= 1.06 + 1e-12


def test_extra_prefill_chunks_cost_c_each_and_do_not_read_as_a_slow_machine():
    model = TimeModel(CO, OnlineSettings(), calibration_chunk_tokens=512)
    n_x = 1024  # the calibration prefilled it in 2 chunks
    assert model.prefill_s(n_x, n_chunks=2) == pytest.approx(CO.prefill_s(n_x))
    assert model.prefill_s(n_x, n_chunks=8) == pytest.approx(CO.prefill_s(n_x) + 6 * CO.c)
    assert model.prefill_s(n_x, n_chunks=1) == pytest.approx(CO.prefill_s(n_x))
    # Goals prefilled in 8 chunks, each at exactly the calibrated speed.
    for _ in range(10):
        model.observe_prefill(n_x, CO.prefill_s(n_x) + 6 * CO.c, n_chunks=8)
    assert model.status(PREFILL).speed_factor == pytest.approx(1.0)
    assert model.status(PREFILL).upper_margin == pytest.approx(1.0)
    # Counted as calibrated chunks, the same times would read as a 1.14x slower machine.
    naive = TimeModel(CO, OnlineSettings())
    naive.observe_prefill(n_x, CO.prefill_s(n_x) + 6 * CO.c)
    assert naive.status(PREFILL).speed_factor == pytest.approx(1 + 6 * CO.c / CO.prefill_s(n_x))
