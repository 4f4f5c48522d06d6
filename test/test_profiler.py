"""Tests of timebill_ros.timing.profiler with a fake engine whose times follow Eq. 4 plus noise.

The fake engine is a stand-in for the timing source only (its times come from a known formula
with seeded noise), so the grid, fitting, hold-out, time limit and caching logic are tested
against known coefficients. A fake clock that the engine advances makes time limits exact.
"""

import math

import numpy as np
import pytest

from timebill_ros.engine import model_source

from timebill_ros.timing import profiler, startup
from timebill_ros.paths import CACHE_ENV
from timebill_ros.timing import model as tm
from timebill_ros.config import EngineConfig, TimingConfig
from timebill_ros.engine.probe import Probe
from timebill_ros.timing.profiler import ProfileGrid

TRUE = tm.TimingCoefficients(a=2e-8, b=2e-4, c=5e-3, p=2e-6, q=0.02)


class FakeClock:
    """Monotonic seconds that only move when advanced."""

    def __init__(self):
        """Start at 100 s."""
        self.now = 100.0

    def __call__(self):
        """Return the current time, seconds."""
        return self.now


class FakeEngine:
    """Engine timing protocol with times from TRUE plus seeded multiplicative noise."""

    def __init__(self, noise=0.005, seed=1, clock=None, context_tokens=8192,
                 coefficients=TRUE):
        """Time with ``coefficients`` and relative noise ``noise``; advance ``clock``."""
        self.rng = np.random.default_rng(seed)
        self.noise = noise
        self.clock = clock
        self.context_tokens = context_tokens
        self.coefficients = coefficients
        self.calls = []

    def _noisy(self, value):
        return value * (1 + self.noise * self.rng.standard_normal())

    def _advance(self, seconds):
        if self.clock is not None:
            self.clock.now += seconds

    def measure_prefill_s(self, n_x, repeats=1):
        """Return the noisy prefill time, seconds; advance the clock by every repeat."""
        self.calls.append(('prefill', n_x, repeats))
        t_s = self.coefficients.prefill_s(n_x)
        self._advance(repeats * t_s)
        return self._noisy(t_s)

    def measure_decode_step_s(self, n_kv, steps=8):
        """Return the noisy decoding-step time, seconds; advance by cache prefill + steps."""
        self.calls.append(('decode', n_kv, steps))
        t_s = self.coefficients.decode_step_s(n_kv)
        self._advance(self.coefficients.prefill_s(n_kv) + steps * t_s)
        return self._noisy(t_s)

    def measure_probe(self, n_in, n_out):
        """Return a noisy Probe (few-shot protocol); advance by its end-to-end time."""
        self.calls.append(('probe', n_in, n_out))
        steps = tuple(self._noisy(self.coefficients.decode_step_s(n))
                      for n in range(n_in, n_in + n_out - 1))
        probe = Probe(n_in, n_out, self._noisy(self.coefficients.prefill_s(n_in)), steps)
        self._advance(probe.e2e_s)
        return probe


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Point TIMEBILL_CACHE at a temporary directory so the home cache is never touched."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / 'cache'))


def test_full_grid_shape():
    """The full grid spans 16 tokens to the limit with about 12 lengths."""
    grid = profiler.full_grid(8192)
    for lengths in (grid.prefill_n_x, grid.decode_n_kv):
        assert 10 <= len(lengths) <= 14
        assert lengths[0] == 16 and lengths[-1] == 4096
        assert list(lengths) == sorted(set(lengths))
    assert grid.method == 'full_grid' and grid.repeats >= 1
    small = profiler.full_grid(1000, max_tokens=4096)
    assert small.prefill_n_x[-1] == 1000
    assert small.decode_n_kv[-1] + small.decode_steps <= 1000
    with pytest.raises(ValueError, match='context_tokens'):
        profiler.full_grid(40)


def test_startup_grid():
    """The start-up grid has the small fixed lengths, clipped to the context."""
    grid = profiler.startup_grid()
    assert grid.prefill_n_x == (32, 128, 256, 512, 1024, 2048)
    assert grid.decode_n_kv == (32, 256, 1024, 2048)
    assert grid.method == 'startup' and grid.repeats == 2 and grid.decode_steps == 16
    clipped = profiler.startup_grid(context_tokens=600)
    assert clipped.prefill_n_x == (32, 128, 256, 512) and clipped.decode_n_kv == (32, 256)


def test_grid_constructors_are_also_classmethods():
    """ProfileGrid.full_grid / .startup_grid equal the module-level constructors."""
    assert ProfileGrid.full_grid(8192, max_tokens=2048) == profiler.full_grid(8192, 2048)
    assert ProfileGrid.startup_grid() == profiler.startup_grid()
    assert ProfileGrid.startup_grid(600) == profiler.startup_grid(600)


@pytest.mark.parametrize('kwargs, word', [
    (dict(prefill_n_x=(32, 16, 64), decode_n_kv=(8, 16)), 'prefill_n_x'),
    (dict(prefill_n_x=(16, 32), decode_n_kv=(8, 16)), 'prefill_n_x'),
    (dict(prefill_n_x=(16, 32, 64), decode_n_kv=(8,)), 'decode_n_kv'),
    (dict(prefill_n_x=(0, 32, 64), decode_n_kv=(8, 16)), r'prefill_n_x\[0\]'),
    (dict(prefill_n_x=(16, 32, 64), decode_n_kv=(8, 16), repeats=0), 'repeats'),
    (dict(prefill_n_x=(16, 32, 64), decode_n_kv=(8, 16), method='x'), 'method'),
])
def test_profile_grid_validation(kwargs, word):
    """A ProfileGrid with a bad field raises, naming it."""
    with pytest.raises(ValueError, match=word):
        ProfileGrid(**kwargs)


def test_profile_recovers_coefficients_and_reports_mape():
    """profile() recovers the fake engine coefficients with MAPE < 5 %."""
    clock, messages = FakeClock(), []
    engine = FakeEngine(clock=clock)
    grid = profiler.full_grid(engine.context_tokens)
    calibration = profiler.profile(engine, grid, clock=clock, progress=messages.append,
                                   engine_config=EngineConfig(threads=2))
    fitted = calibration.coefficients
    np.testing.assert_allclose((fitted.a, fitted.b), (TRUE.a, TRUE.b), rtol=0.05)
    np.testing.assert_allclose((fitted.p, fitted.q), (TRUE.p, TRUE.q), rtol=0.05)
    assert calibration.prefill_mape_pct < 5 and calibration.decode_mape_pct < 5
    n_grid = len(grid.prefill_n_x) + len(grid.decode_n_kv)
    assert calibration.n_points == n_grid
    assert len(engine.calls) == n_grid + 2  # one unrecorded warm-up per phase
    assert calibration.method == 'full_grid'
    assert calibration.threads == 2
    assert calibration.model_key == model_source.EMBEDDED_MODEL_KEY
    assert calibration.profiling_s == pytest.approx(clock.now - 100.0)
    assert [n for n, _ in calibration.prefill_points] == list(grid.prefill_n_x)
    assert any('warm-up' in m for m in messages) and any(f'[{n_grid}/' in m for m in messages)
    assert 'MAPE prefill' in profiler.format_report(calibration)


def test_profile_order_is_randomised_and_seeded():
    """Measurement order is shuffled, reproducibly per seed."""
    def order(seed):
        engine = FakeEngine()
        profiler.profile(engine, profiler.full_grid(8192), rng_seed=seed)
        return engine.calls[2:]

    assert order(3) == order(3)
    assert order(3) != order(4)
    prefill = [n for kind, n, _ in order(3) if kind == 'prefill']
    assert prefill != sorted(prefill)


def test_profile_held_out_mape_uses_a_fit_without_those_points():
    """The MAPE scores held-out lengths against a fit without them."""
    # A point far off the model, held out (grid index 1), shows up in the MAPE.
    class Spiky(FakeEngine):
        def measure_prefill_s(self, n_x, repeats=1):
            value = super().measure_prefill_s(n_x, repeats)
            return value * 2 if n_x == 64 else value

    grid = ProfileGrid((16, 64, 256, 1024, 4096), (16, 256, 4096))
    calibration = profiler.profile(Spiky(noise=0.0), grid, held_out_every=3)
    # Held out: index 1 (N_x=64, 50 % off the fit) and index 4 (exact): mean 25 %.
    assert calibration.prefill_mape_pct == pytest.approx(25.0, abs=1.0)
    assert calibration.decode_mape_pct == pytest.approx(0.0, abs=1e-6)


def test_profile_without_held_out_points_reports_none():
    """MAPE is None when the hold-out would leave too few points."""
    grid = ProfileGrid((16, 64, 256), (16, 256))
    calibration = profiler.profile(FakeEngine(noise=0.0), grid, held_out_every=3)
    # Holding out N_x=64 would leave 2 points for 3 unknowns: no held-out MAPE.
    assert calibration.prefill_mape_pct is None and calibration.decode_mape_pct is None
    assert 'n/a' in profiler.format_report(calibration)


# A fixed small grid, so these tests do not move when the start-up grid is retuned.
SMALL_GRID = ProfileGrid((32, 128, 512, 1024), (32, 256, 1024), repeats=1, decode_steps=8,
                         method='startup')


def _limited_run(limit_s):
    clock, messages = FakeClock(), []
    engine = FakeEngine(clock=clock)
    calibration = profiler.profile(engine, SMALL_GRID, clock=clock,
                                   time_limit_s=limit_s, progress=messages.append)
    return calibration, engine, messages


def test_time_limit_stops_early_deterministically():
    """time_limit_s skips lengths, the same ones every run."""
    full, _, _ = _limited_run(None)
    first, engine, messages = _limited_run(1.4)
    second, _, _ = _limited_run(1.4)
    assert first.n_points < full.n_points
    assert first.prefill_points == second.prefill_points
    assert first.decode_points == second.decode_points
    assert first.profiling_s <= 1.4
    assert any('skipped' in m for m in messages)
    assert len(engine.calls) == first.n_points + 2


def test_time_limit_too_short_raises_with_point_count():
    """Too little time for a fit raises, saying how many points."""
    with pytest.raises(RuntimeError, match=r'got \d+ prefill point\(s\).*time_limit_s=0.5'):
        _limited_run(0.5)


def test_profile_rejects_bad_engine_and_arguments():
    """A partial engine, a grid too long or bad arguments raise."""
    grid = profiler.startup_grid()
    with pytest.raises(TypeError, match='measure_decode_step_s'):
        profiler.profile(type('E', (), {'context_tokens': 8192,
                                        'measure_prefill_s': lambda self, n, repeats=1: 1.0})(),
                         grid)
    with pytest.raises(ValueError, match='context'):
        profiler.profile(FakeEngine(context_tokens=600), grid)
    with pytest.raises(ValueError, match='held_out_every'):
        profiler.profile(FakeEngine(), grid, held_out_every=1)
    with pytest.raises(ValueError, match='time_limit_s'):
        profiler.profile(FakeEngine(), grid, time_limit_s=-1)
    with pytest.raises(TypeError, match='grid'):
        profiler.profile(FakeEngine(), (32, 64))


def test_profile_rejects_bad_engine_measurement():
    """A non-finite engine measurement raises RuntimeError."""
    engine = FakeEngine()
    engine.measure_decode_step_s = lambda n_kv, steps=8: math.nan
    with pytest.raises(RuntimeError, match='N_kv=1024'):
        profiler.profile(engine, SMALL_GRID)


def test_load_or_calibrate_profiles_once_then_uses_cache():
    """The first call profiles and caches; the second only loads."""
    engine_config, timing_config, log = EngineConfig(), TimingConfig(startup_method='grid'), []
    first_engine = FakeEngine()
    first = startup.load_or_calibrate(first_engine, engine_config, timing_config,
                                      log=log.append)
    assert first.method == 'startup' and first_engine.calls
    key = tm.calibration_key(*profiler.key_fields(engine_config))
    path = tm.default_calibration_path(key)
    assert tm.Calibration.load(path) == first
    second_engine = FakeEngine()
    second = startup.load_or_calibrate(second_engine, engine_config, timing_config,
                                       log=log.append)
    assert second == first and second_engine.calls == []
    assert any('cached' in line for line in log)


def test_load_or_calibrate_honours_calibration_file(tmp_path):
    """timing.calibration_file is loaded; a missing one raises."""
    path = tmp_path / 'mine.yaml'
    made = profiler.profile(FakeEngine(), profiler.startup_grid())
    made.save(path)
    engine, log = FakeEngine(), []
    loaded = startup.load_or_calibrate(engine, EngineConfig(dtype='bfloat16'),
                                       TimingConfig(calibration_file=str(path)), log=log.append)
    assert loaded == made and engine.calls == []
    assert any('warning' in line for line in log)  # made for float32, engine is bfloat16
    with pytest.raises(FileNotFoundError, match='missing.yaml'):
        startup.load_or_calibrate(engine, EngineConfig(),
                                  TimingConfig(calibration_file=str(tmp_path / 'missing.yaml')))


def test_load_or_calibrate_raises_without_cache_when_not_calibrating():
    """No cache and no start-up calibration raises."""
    engine = FakeEngine()
    with pytest.raises(RuntimeError, match='timebill profile'):
        startup.load_or_calibrate(engine, EngineConfig(),
                                  TimingConfig(calibrate_on_start=False), log=lambda _m: None)
    assert engine.calls == []


def test_load_or_calibrate_recalibrates_over_corrupt_cache():
    """An unreadable cache entry is replaced by a new calibration."""
    engine_config = EngineConfig()
    path = tm.default_calibration_path(tm.calibration_key(*profiler.key_fields(engine_config)))
    profiler.profile(FakeEngine(), profiler.startup_grid()).save(path)
    with open(path, 'w', encoding='utf-8') as stream:
        stream.write('coefficients: [')
    log = []
    calibration = startup.load_or_calibrate(FakeEngine(), engine_config, TimingConfig(),
                                            log=log.append)
    assert tm.Calibration.load(path) == calibration
    assert any('unreadable' in line for line in log)


def test_a_cache_that_cannot_be_written_still_gives_a_calibration(tmp_path, monkeypatch):
    """A read-only or unusable cache folder: the start-up calibration is used, not saved.

    (The cache path lies under a plain file, so creating it fails even for root.)
    """
    blocker = tmp_path / 'a_file'
    blocker.write_text('not a folder')
    monkeypatch.setenv(CACHE_ENV, str(blocker / 'cache'))
    log = []
    calibration = startup.load_or_calibrate(FakeEngine(), EngineConfig(), TimingConfig(),
                                            log=log.append)
    assert calibration.coefficients is not None
    assert any('could not cache the timing calibration' in line for line in log)


def test_key_fields_follow_model_source():
    """The key's model id is model_source.model_key, as engine.model_key and the CLI use."""
    config = EngineConfig(dtype='bfloat16', threads=3, decode_weights='float16')
    assert profiler.key_fields(config) == (model_source.model_key(config), 'cpu',
                                           'bfloat16-auto-float16', 3)
    with pytest.raises(TypeError, match='engine_config'):
        profiler.key_fields({'device': 'cpu'})


def test_profile_takes_key_fields_from_the_engine_config():
    """Without engine_config, profile() uses engine.engine_config when the engine has one."""
    engine = FakeEngine()
    engine.engine_config = EngineConfig(dtype='float16', threads=4, decode_weights='float16')
    calibration = profiler.profile(engine, profiler.startup_grid())
    assert (calibration.dtype, calibration.threads) == ('float16-auto-float16', 4)
    assert calibration.model_key == model_source.model_key(engine.engine_config)
    explicit = profiler.profile(FakeEngine(), profiler.startup_grid(),
                                engine_config=EngineConfig(threads=1))
    assert explicit.threads == 1


def test_load_or_calibrate_few_shot_at_start_up():
    """startup_method few_shot (the default) calibrates from five probes and caches it."""
    engine, log = FakeEngine(noise=0.0), []
    calibration = startup.load_or_calibrate(engine, EngineConfig(), TimingConfig(),
                                            log=log.append)
    assert calibration.method == 'few_shot'
    assert [call[0] for call in engine.calls] == ['probe'] * 6  # warm-up + 5
    for name in tm.COEFFICIENT_NAMES:
        assert getattr(calibration.coefficients, name) == pytest.approx(
            getattr(TRUE, name), rel=1e-6, abs=1e-12)
    path = tm.default_calibration_path(tm.calibration_key(*profiler.key_fields(EngineConfig())))
    assert tm.Calibration.load(path) == calibration
    assert any('few_shot calibration at start-up' in line for line in log)


def test_timing_startup_method_is_checked():
    """An unknown timing.startup_method is a ValueError naming the parameter."""
    with pytest.raises(ValueError, match='timing.startup_method'):
        TimingConfig(startup_method='fast')
