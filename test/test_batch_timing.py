"""The batched decoding step model (timing/batch.py), its calibration points and probes."""

import pytest
import yaml

from timebill_ros.timing import batch, model as tm
from timebill_ros.timing.probes import EngineProbes
from timebill_ros.timing.profiler import format_report

from test_timing_model import _calibration

# t = 0.02 + 0.004 (B - 1) + 1e-6 S, exactly.
TRUE = batch.BatchStepCoefficients(q=0.02, r=0.004, p=1e-6)
POINTS = tuple((b, s, TRUE.step_s(b, s)) for b in (1, 2, 4, 8) for s in (128 * b, 1024 * b))


def test_the_fit_recovers_the_coefficients():
    fitted = batch.fit_batch_step(POINTS)
    for name in ('q', 'r', 'p'):
        assert getattr(fitted, name) == pytest.approx(getattr(TRUE, name), rel=1e-9, abs=1e-12)
    assert TRUE.step_s(8, 8000) == pytest.approx(0.02 + 0.028 + 0.008)
    assert TRUE.per_token_s(8, 8000) == pytest.approx(0.056 / 8)


def test_a_negative_term_is_clamped_and_the_rest_refitted():
    # Steps that get cheaper with more cached tokens (noise): p is clamped to 0.
    points = [(1, 100, 0.030), (1, 1000, 0.029), (4, 400, 0.041), (4, 4000, 0.040)]
    fitted = batch.fit_batch_step(points)
    assert fitted.p == 0.0 and fitted.r > 0 and fitted.q > 0


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match='two or more batch sizes'):
        batch.fit_batch_step([(1, 100, 0.03), (1, 200, 0.031)])
    with pytest.raises(ValueError, match='batch_size'):
        TRUE.step_s(0, 10)
    with pytest.raises(ValueError, match=r'batch_points\[0\]'):
        _calibration(batch_points=((1, 100),))


def test_batch_points_round_trip_and_older_files_still_load(tmp_path):
    calibration = _calibration(batch_points=POINTS)
    path = tmp_path / 'cal.yaml'
    calibration.save(path)
    loaded = tm.Calibration.load(path)
    assert loaded == calibration
    assert loaded.batch_step.r == pytest.approx(0.004, rel=1e-9)
    assert 'batch step' in format_report(loaded) and 'B = 1, 2, 4, 8' in format_report(loaded)
    data = yaml.safe_load(path.read_text())
    del data['batch_points']  # a calibration written before the batch dimension
    old = tm.Calibration.from_dict(data)
    assert old.batch_points == () and old.batch_step is None
    assert 'batch step' not in format_report(old)


def test_probes_run_the_engines_batch(make_tiny_engine):
    lean = make_tiny_engine(forward='lean')
    points = batch.probe_batches(lean, sizes=(1, 2, 4), kv_lengths=(16, 64), steps=2)
    assert [(b, s) for b, s, _ in points] == [(1, 17), (2, 34), (4, 68), (1, 65), (2, 130),
                                              (4, 260)]
    assert all(t > 0 for _, _, t in points)
    batch.fit_batch_step(points)  # enough points to fit
    single = make_tiny_engine(forward='transformers')  # one goal per step: B > 1 skipped
    assert [b for b, _, _ in batch.probe_batches(single, kv_lengths=(16,), steps=1)] == [1]
    with pytest.raises(ValueError, match='batch_size'):
        EngineProbes(single).measure_batch_step_s(2, 16)
