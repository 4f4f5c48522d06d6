"""Tests of timebill_ros.timing.model: Eq. 4-8 math, fitting, MAPE, calibration files."""

import math
import os

import numpy as np
import pytest
import yaml

from timebill_ros.paths import CACHE_ENV
from timebill_ros.timing import model as tm
from timebill_ros.timing.model import Calibration, TimingCoefficients

COEFFS = TimingCoefficients(a=1e-6, b=1e-3, c=0.05, p=2e-5, q=0.01)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Point TIMEBILL_CACHE at a temporary directory so the home cache is never touched."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / 'cache'))


def _calibration(**overrides):
    """Return a valid Calibration, with ``overrides`` applied."""
    fields = dict(
        coefficients=COEFFS, model_key='SmolLM2-135M-Instruct-gguf', device='cpu',
        dtype='float32', threads=2, prefill_mape_pct=1.25, decode_mape_pct=None, n_points=5,
        profiling_s=3.5, created='2025-01-02T03:04:05+00:00', method='startup',
        prefill_points=((32, 0.051), (128, 0.19), (512, 0.8)),
        decode_points=((32, 0.0106), (256, 0.0151)))
    fields.update(overrides)
    return Calibration(**fields)


def test_prefill_and_decode_step_match_hand_values():
    """Eq. 4a and 4b give the hand-computed seconds."""
    assert COEFFS.prefill_s(100) == pytest.approx(1e-6 * 100 ** 2 + 1e-3 * 100 + 0.05)
    assert COEFFS.prefill_s(100) == pytest.approx(0.16)
    assert COEFFS.prefill_s(0) == pytest.approx(0.05)
    assert COEFFS.decode_step_s(200) == pytest.approx(0.014)
    assert COEFFS.decode_step_s(np.int64(200)) == pytest.approx(0.014)


def test_decode_phase_hand_value():
    """Eq. 7 for 3 decoding steps gives the hand-computed seconds."""
    # N = 4 -> 3 steps with (1 - 0.5) * 100 + i - 1 = 50, 51, 52 cached tokens.
    assert COEFFS.decode_phase_s(100, 0.5, 4) == pytest.approx(2e-5 * (50 + 51 + 52) + 3 * 0.01)


@pytest.mark.parametrize('n_x', [0, 1, 37, 1000])
@pytest.mark.parametrize('alpha', [0.0, 0.25, 0.9])
@pytest.mark.parametrize('n_tokens', [0, 1, 2, 3, 17, 256])
def test_decode_phase_closed_form_equals_explicit_sum(n_x, alpha, n_tokens):
    """The closed form equals the explicit sum of Eqs. 6-7."""
    explicit = sum(COEFFS.p * ((1 - alpha) * n_x + i - 1) + COEFFS.q
                   for i in range(1, n_tokens))
    assert COEFFS.decode_phase_s(n_x, alpha, n_tokens) == pytest.approx(explicit, rel=1e-12,
                                                                        abs=1e-15)


@pytest.mark.parametrize('n_tokens', [0, 1])
def test_decode_phase_is_zero_without_decoding_steps(n_tokens):
    """No decoding step when the response has at most 1 token."""
    assert COEFFS.decode_phase_s(500, 0.3, n_tokens) == 0.0


def test_e2e_is_prefill_plus_decode_phase():
    """Eq. 8: end-to-end time is prefill plus decoding phase."""
    expected = COEFFS.prefill_s(300) + COEFFS.decode_phase_s(300, 0.4, 64)
    assert COEFFS.e2e_s(300, 0.4, 64) == pytest.approx(expected)
    assert COEFFS.e2e_s(300, 0.0, 1) == pytest.approx(COEFFS.prefill_s(300))


@pytest.mark.parametrize('call, exc, word', [
    (lambda: COEFFS.prefill_s(-1), ValueError, 'n_x'),
    (lambda: COEFFS.prefill_s(1.5), TypeError, 'n_x'),
    (lambda: COEFFS.prefill_s(True), TypeError, 'n_x'),
    (lambda: COEFFS.decode_step_s(-3), ValueError, 'n_kv'),
    (lambda: COEFFS.decode_phase_s(10, 1.0, 5), ValueError, 'alpha'),
    (lambda: COEFFS.decode_phase_s(10, -0.1, 5), ValueError, 'alpha'),
    (lambda: COEFFS.decode_phase_s(10, math.nan, 5), ValueError, 'alpha'),
    (lambda: COEFFS.decode_phase_s(10, '0.5', 5), TypeError, 'alpha'),
    (lambda: COEFFS.e2e_s(10, 0.5, -2), ValueError, 'n_tokens'),
    (lambda: TimingCoefficients(-1.0, 0, 0, 0, 0), ValueError, 'coefficients.a'),
    (lambda: TimingCoefficients(0, 0, 0, math.inf, 0), ValueError, 'coefficients.p'),
    (lambda: TimingCoefficients(0, 0, 0, 0, 'x'), TypeError, 'coefficients.q'),
])
def test_bad_inputs_raise_naming_the_value(call, exc, word):
    """Bad lengths, alpha and coefficients raise, naming the value."""
    with pytest.raises(exc, match=word):
        call()


def test_fit_recovers_noiseless_coefficients():
    """Noiseless synthetic times give the coefficients within 1e-6."""
    n = np.array([16, 32, 64, 128, 256, 512, 1024, 2048, 4096])
    a, b, c, p, q = 2e-8, 2e-4, 5e-3, 2e-6, 0.02
    fitted_prefill = tm.fit_prefill(n, a * n ** 2 + b * n + c)
    fitted_decode = tm.fit_decode(n, p * n + q)
    np.testing.assert_allclose(fitted_prefill, (a, b, c), rtol=1e-6)
    np.testing.assert_allclose(fitted_decode, (p, q), rtol=1e-6)
    assert all(isinstance(x, float) for x in fitted_prefill + fitted_decode)


def test_fit_recovers_coefficients_with_seeded_noise():
    """1 % seeded noise gives the coefficients within a few percent."""
    rng = np.random.default_rng(7)
    n = np.repeat(np.linspace(16, 4096, 16).round(), 4)
    a, b, c, p, q = 2e-8, 2e-4, 5e-3, 2e-6, 0.02
    noise = 1 + 0.01 * rng.standard_normal(n.size)
    fitted_prefill = tm.fit_prefill(n, (a * n ** 2 + b * n + c) * noise)
    fitted_decode = tm.fit_decode(n, (p * n + q) * noise)
    np.testing.assert_allclose(fitted_prefill[:2], (a, b), rtol=0.05)
    np.testing.assert_allclose(fitted_decode, (p, q), rtol=0.05)
    # c is small next to the noise at long prompts; check the curve instead.
    fitted = TimingCoefficients(*fitted_prefill, *fitted_decode)
    truth = TimingCoefficients(a, b, c, p, q)
    grid = [16, 256, 1024, 4096]
    assert tm.mape([fitted.prefill_s(x) for x in grid], [truth.prefill_s(x) for x in grid]) < 3


def test_fit_keeps_coefficients_non_negative():
    """Decreasing times still fit non-negative coefficients."""
    n = np.array([10, 20, 30, 40])
    a, b, c = tm.fit_prefill(n, [0.4, 0.3, 0.2, 0.1])
    p, q = tm.fit_decode(n, [0.4, 0.3, 0.2, 0.1])
    assert min(a, b, c, p, q) >= 0


@pytest.mark.parametrize('fit, n, t', [
    (tm.fit_prefill, [1, 2], [0.1, 0.2]),
    (tm.fit_prefill, [1, 1, 2, 2], [0.1, 0.1, 0.2, 0.2]),
    (tm.fit_decode, [5], [0.1]),
    (tm.fit_decode, [1, 2, 3], [0.1, math.nan, 0.3]),
    (tm.fit_prefill, [1, 2, math.inf], [0.1, 0.2, 0.3]),
    (tm.fit_decode, [1, 2, 3], [0.1, 0.2]),
    (tm.fit_decode, [-1, 2, 3], [0.1, 0.2, 0.3]),
])
def test_fit_rejects_bad_data(fit, n, t):
    """Too few distinct lengths, non-finite or negative data raise ValueError."""
    with pytest.raises(ValueError):
        fit(n, t)


def test_mape_in_percent():
    """MAPE is the mean absolute relative error in percent."""
    assert tm.mape([110.0, 90.0], [100.0, 100.0]) == pytest.approx(10.0)
    assert tm.mape(np.array([2.0]), np.array([2.0])) == 0.0


@pytest.mark.parametrize('pred, actual', [([], []), ([1.0], [1.0, 2.0]), ([1.0], [0.0]),
                                          ([math.nan], [1.0])])
def test_mape_rejects_bad_input(pred, actual):
    """Empty, mismatched, zero-actual or non-finite input raises."""
    with pytest.raises(ValueError):
        tm.mape(pred, actual)


def test_save_load_round_trip(tmp_path):
    """save() then load() gives an equal Calibration and leaves no temp file."""
    calibration = _calibration()
    path = tmp_path / 'sub' / 'cal.yaml'
    calibration.save(path)
    assert Calibration.load(path) == calibration
    assert Calibration.load(str(path)).coefficients.a == COEFFS.a
    assert os.listdir(path.parent) == ['cal.yaml']  # no temporary file left behind
    data = yaml.safe_load(path.read_text())
    assert data['format_version'] == tm.FORMAT_VERSION
    assert data['prefill_points'][0] == [32, 0.051]


def test_save_replaces_existing_file(tmp_path):
    """save() over an existing file replaces it."""
    path = tmp_path / 'cal.yaml'
    _calibration(threads=1).save(path)
    _calibration(threads=4).save(path)
    assert Calibration.load(path).threads == 4


def _edit(data, field, value):
    """Set ``field`` (``a.b`` for nested) to ``value``, or delete it when value is ...."""
    *parents, leaf = field.split('.')
    for name in parents:
        data = data[name]
    if value is Ellipsis:
        del data[leaf]
    else:
        data[leaf] = value


@pytest.mark.parametrize('field, value, word', [
    ('coefficients.a', 'abc', 'coefficients.a'),
    ('coefficients.q', -0.5, 'coefficients.q'),
    ('coefficients.p', ..., 'coefficients'),
    ('coefficients', [1, 2], 'coefficients'),
    ('threads', ..., 'threads'),
    ('threads', -1, 'threads'),
    ('method', 'guess', 'method'),
    ('created', 'yesterday', 'created'),
    ('prefill_mape_pct', 'low', 'prefill_mape_pct'),
    ('prefill_points', [[32]], r'prefill_points\[0\]'),
    ('decode_points', [[32, 'slow']], r'decode_points\[0\]\[1\]'),
    ('n_points', 99, 'n_points'),
    ('format_version', 2, 'format_version'),
    ('model_key', '', 'model_key'),
])
def test_load_malformed_field_names_file_and_field(tmp_path, field, value, word):
    """A malformed field raises ValueError naming the file and field."""
    path = tmp_path / 'cal.yaml'
    data = _calibration().to_dict()
    _edit(data, field, value)
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=word) as info:
        Calibration.load(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize('text', ['a: [1, 2', '- 1\n- 2\n', ''])
def test_load_non_mapping_or_bad_yaml_names_file(tmp_path, text):
    """Invalid YAML or a non-mapping raises ValueError naming the file."""
    path = tmp_path / 'cal.yaml'
    path.write_text(text)
    with pytest.raises(ValueError, match='cal.yaml'):
        Calibration.load(path)


def test_calibration_rejects_mismatched_n_points():
    """n_points must equal the number of raw points."""
    with pytest.raises(ValueError, match='n_points'):
        _calibration(n_points=4)


def test_calibration_key_is_filename_safe_and_distinct():
    """Keys are filename-safe, bounded and do not collide."""
    key = tm.calibration_key('SmolLM2-135M-Instruct-gguf', 'cpu', 'float32', 0)
    assert key == 'SmolLM2-135M-Instruct-gguf__cpu__float32__t0'
    odd = tm.calibration_key('../models/My Model', 'cuda:0', 'float16', 8)
    assert '/' not in odd and ' ' not in odd and ':' not in odd and not odd.startswith('.')
    assert odd != tm.calibration_key('.._models_My_Model', 'cuda_0', 'float16', 8)
    assert len(tm.calibration_key('x' * 500, 'cpu', 'float32', 0)) < 120
    assert _calibration().key == tm.calibration_key('SmolLM2-135M-Instruct-gguf', 'cpu',
                                                    'float32', 2)


@pytest.mark.parametrize('args, exc', [(('', 'cpu', 'float32', 0), ValueError),
                                       (('m', 'cpu', 'float32', -1), ValueError),
                                       (('m', None, 'float32', 0), TypeError)])
def test_calibration_key_rejects_bad_fields(args, exc):
    """Empty or badly typed key fields raise."""
    with pytest.raises(exc):
        tm.calibration_key(*args)


def test_default_calibration_path_cache_resolution(tmp_path, monkeypatch):
    """cache_dir, then $TIMEBILL_CACHE, then ~/.cache/timebill_ros."""
    key = tm.calibration_key('m', 'cpu', 'float32', 0)
    assert tm.default_calibration_path(key) == str(
        tmp_path / 'cache' / 'calibration' / f'{key}.yaml')
    assert tm.default_calibration_path(key, cache_dir=str(tmp_path / 'other')) == str(
        tmp_path / 'other' / 'calibration' / f'{key}.yaml')
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv('HOME', str(tmp_path / 'home'))
    assert tm.default_calibration_path(key) == str(
        tmp_path / 'home' / '.cache' / 'timebill_ros' / 'calibration' / f'{key}.yaml')
    with pytest.raises(ValueError, match='key'):
        tm.default_calibration_path('../escape')


def test_the_mask_cost_is_probed_once_and_kept_in_the_calibration(monkeypatch):
    """The json_schema mask's step cost: probed when the calibration lacks it, then stored."""
    from timebill_ros.config import ServerConfig
    from timebill_ros.server.backends import local as factory
    probes = []
    monkeypatch.setattr(factory, 'mask_cost', lambda engine, log: probes.append(1) or 2.5e-4)
    config, logs = ServerConfig(), []
    first = factory.with_mask_cost(config, None, _calibration(), logs.append)
    assert first.mask_step_s == 2.5e-4 and probes == [1]
    stored = Calibration.load(tm.default_calibration_path(first.key))
    assert stored.mask_step_s == 2.5e-4
    again = factory.with_mask_cost(config, None, stored, logs.append)
    assert again.mask_step_s == 2.5e-4 and probes == [1]  # not probed again
    assert _calibration().mask_step_s is None  # files written before keep loading
    with pytest.raises(ValueError, match='mask_step_s'):
        _calibration(mask_step_s=-1.0)


def test_a_benchmark_reads_the_step_format_from_the_keys_third_field(tmp_path):
    """bench/server_process.decode_weights_of: a GGUF model's key has a fourth field."""
    from timebill_ros.bench.server_process import decode_weights_of
    assert decode_weights_of(tmp_path / 'none.yaml') == 'auto'
    for dtype, step in (('float32-auto-gguf-bfloat16', 'gguf'),
                        ('float32-lean-float16', 'float16')):
        path = tmp_path / f'{step}.yaml'
        _calibration(dtype=dtype).save(path)
        assert decode_weights_of(path) == step
