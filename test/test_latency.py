"""Tests of the latency harness, grid, point selection and predictors (SimFLi, issue 4).

Synthetic probes come from known formulas (Eq. 4 or SimFLi's saturating model), so each
predictor is checked against the coefficients that made the data; the engine tests run the
real engine on the tiny random-weight model.
"""

import json
import math

import numpy as np
import pytest

from timebill_ros.latency import evaluate as ev
from timebill_ros.timing import selection
from timebill_ros.timing.design import GridDesign
from timebill_ros.timing.few_shot import few_shot_probes, few_shot_profile, range_first
from timebill_ros.latency.grid import GridRun, LatencyGrid
from timebill_ros.latency.harness import measure_grid
from timebill_ros.latency.hardware import Hardware
from timebill_ros.latency.estimators.base import model_from_coefficients
from timebill_ros.latency.estimators.linear import LinearRegression
from timebill_ros.latency.estimators.roofline import Architecture, Roofline
from timebill_ros.latency.estimators.roofline_lr import RooflineRegression
from timebill_ros.latency.estimators.section_tps import SectionTps
from timebill_ros.latency.estimators.simfli_lm import SimFLiLinear
from timebill_ros.latency.estimators.simfli_sam import SimFLiSaturating, fit_saturating_tps
from timebill_ros.latency.estimators.timebill_ls import TimeBillLeastSquares
from timebill_ros.engine.probe import Probe
from timebill_ros.latency.wcet import GoalTiming, exceed_table
from timebill_ros.engine.stopping import StepTimer, StopCriteria
from timebill_ros.timing.model import COEFFICIENT_NAMES, Calibration, TimingCoefficients
from timebill_ros.timing.probes import EngineProbes

# Roughly this CPU: quadratic prefill, decoding step growing with the cache.
EQ4 = TimingCoefficients(a=3e-7, b=1.7e-3, c=0.06, p=5e-6, q=0.065)
SMALL = GridDesign(id_n_in=(16, 32, 64, 128, 256, 512), heldout_n_in=(1024, 2048),
                   id_n_out=(4, 8), heldout_n_out=(16,), probe_n_out=(4, 8))


def eq4_probe(n_in, n_out, co=EQ4, noise=0.0, rng=None):
    """Return a Probe timed by Eq. 4 with optional relative noise."""
    def jitter(value):
        return value * (1 + noise * rng.standard_normal()) if noise else value
    steps = tuple(jitter(co.decode_step_s(n)) for n in range(n_in, n_in + n_out - 1))
    return Probe(n_in, n_out, jitter(co.prefill_s(n_in)), steps)


class FakeProbeEngine:
    """Timing source with the measure_probe protocol; advances a fake clock by each probe."""

    def __init__(self, co=EQ4, noise=0.0, context_tokens=8192):
        """Time by ``co`` with relative ``noise``."""
        self.co, self.noise, self.context_tokens = co, noise, context_tokens
        self.rng = np.random.default_rng(0)
        self.now = 0.0
        self.calls = []

    def clock(self):
        """Return the fake time, seconds."""
        return self.now

    def measure_probe(self, n_in, n_out):
        """Return an Eq. 4 probe; advance the clock by its end-to-end time."""
        self.calls.append((n_in, n_out))
        probe = eq4_probe(n_in, n_out, self.co, self.noise, self.rng)
        self.now += probe.e2e_s
        return probe


def synthetic_grid(design=SMALL, repeats=2, co=EQ4, noise=0.0):
    """Return a LatencyGrid measured on the fake engine (no sleeping)."""
    engine = FakeProbeEngine(co, noise)
    return measure_grid(engine, design.n_in_values, design.n_out_max, repeats=repeats,
                        cooldown_s=0.0, sleep=lambda s: None, clock=engine.clock,
                        meta={'model_key': 'fake'})


def test_probe_checks_and_derived_times():
    """A probe needs n_out - 1 steps; e2e is prefill plus steps; truncation keeps a prefix."""
    probe = Probe(10, 4, 0.5, (0.1, 0.2, 0.3))
    assert probe.e2e_s == pytest.approx(1.1) and probe.n_kv_steps == (10, 11, 12)
    assert probe.truncated(2) == Probe(10, 2, 0.5, (0.1,))
    assert probe.truncated(1).e2e_s == 0.5
    with pytest.raises(ValueError, match='n_out - 1 = 3'):
        Probe(10, 4, 0.5, (0.1,))
    with pytest.raises(ValueError, match='ttft_s'):
        Probe(10, 1, -1.0, ())
    with pytest.raises(TypeError, match='n_in'):
        Probe(1.5, 1, 0.1, ())
    with pytest.raises(ValueError, match='<= 4'):
        probe.truncated(5)


def test_step_timer_records_decoding_checks_only():
    """The timer ignores prefill checks (n_generated 0) and never stops generation."""
    ticks = iter([1.0, 1.5, 2.25])
    timer = StepTimer(clock=lambda: next(ticks))
    criteria = StopCriteria([timer])
    assert criteria.check(0) is None
    for n in (1, 2, 3):
        assert criteria.check(n, 7) is None
    assert timer.step_durations_s() == [0.5, 0.75]


def test_engine_probe_has_exact_length(make_tiny_engine):
    """The real engine's probe decodes exactly n_out tokens with eviction off."""
    engine = make_tiny_engine()
    probe = EngineProbes(engine).measure_probe(40, 6)
    assert (probe.n_in, probe.n_out, len(probe.step_s)) == (40, 6, 5)
    assert probe.ttft_s > 0 and all(s > 0 for s in probe.step_s)
    with pytest.raises(ValueError, match='n_in'):
        EngineProbes(engine).measure_probe(engine.context_tokens, 2)


def test_measure_grid_orders_randomly_and_cools_down(tmp_path):
    """Every length once per repeat, a seeded shuffle per repeat, one sleep per run."""
    engine, slept = FakeProbeEngine(), []
    grid = measure_grid(engine, (64, 16, 32, 128), 5, repeats=3, cooldown_s=1.5,
                        sleep=slept.append, clock=engine.clock, seed=3)
    assert grid.n_in_values == (16, 32, 64, 128) and grid.repeats == (0, 1, 2)
    assert slept == [1.5] * 12 and engine.calls[0] == (128, 5)  # warm-up at the longest
    orders = [[r.probe.n_in for r in grid.runs if r.repeat == k] for k in range(3)]
    assert len({tuple(o) for o in orders}) > 1
    again = measure_grid(FakeProbeEngine(), (16, 32, 64, 128), 5, repeats=3, cooldown_s=0,
                         sleep=lambda s: None, seed=3)
    assert [r.probe.n_in for r in again.runs] == [r.probe.n_in for r in grid.runs]
    assert grid.meta['wall_s'] == pytest.approx(engine.now, abs=1e-3)
    grid.save(tmp_path / 'g.json')
    assert LatencyGrid.load(tmp_path / 'g.json') == grid
    grid.save_csv(tmp_path / 'g.csv', (1, 3, 5))
    assert len((tmp_path / 'g.csv').read_text().splitlines()) == 1 + 12 * 3


def test_grid_views_and_checks():
    """Means over repeats, step lookup by cache length; incomplete grids are refused."""
    grid = synthetic_grid()
    assert grid.e2e_s(64, 8) == pytest.approx(eq4_probe(64, 8).e2e_s)
    assert grid.step_s(70) == pytest.approx(EQ4.decode_step_s(70))
    with pytest.raises(KeyError, match='n_kv=1'):
        grid.step_s(1)
    runs = grid.runs[:-1]
    with pytest.raises(ValueError, match='incomplete'):
        LatencyGrid(runs, {})
    mixed = runs + (GridRun(1, 0, Probe(2048, 2, 1.0, (0.1,))),)
    with pytest.raises(ValueError, match='same n_out_max'):
        LatencyGrid(mixed, {})
    with pytest.raises(ValueError, match='format_version'):
        LatencyGrid.from_dict({'runs': []})


def test_design_splits_cells():
    """In-distribution is the n_in x n_out rectangle; held-out is every other cell."""
    assert len(SMALL.cells('id')) == 12 and len(SMALL.cells('heldout')) == 24 - 12
    assert set(SMALL.cells('id')) | set(SMALL.cells('heldout')) == set(SMALL.cells('all'))
    with pytest.raises(ValueError, match='above'):
        GridDesign(heldout_n_in=(100,))
    with pytest.raises(ValueError, match='split'):
        SMALL.cells('test')


def test_exponential_inputs_snap_geometrically():
    """Five geometric targets from 16 to 2048 snap to the default grid (ties: smaller)."""
    assert selection.exponential_inputs(GridDesign().id_n_in, 5) == (16, 64, 128, 512, 2048)
    assert selection.exponential_inputs((10, 11, 12), 3) == (10, 11, 12)
    with pytest.raises(ValueError, match='exceeds'):
        selection.exponential_inputs((16, 32), 3)


def test_fsp_finds_the_saturation_boundary():
    """Halving from the top, a >= 10 % TPS drop marks the boundary; 5 points around it."""
    available = (8, 16, 32, 64, 128, 256, 512)

    def ttft(n):  # TPS flat (1000/s) down to 64 tokens, then falls steeply below
        return n / 1000.0 if n >= 64 else n / (1000.0 * n / 64)
    inputs, trace = selection.fsp_inputs(available, 5, ttft)
    assert trace == (512, 256, 128, 64, 32)
    assert inputs == (16, 32, 64, 128, 256)  # boundary, then above / below alternately
    flat_inputs, flat_trace = selection.fsp_inputs(available, 5, lambda n: n / 1000.0)
    assert flat_trace == (512, 256, 128, 64, 32, 16, 8)
    assert flat_inputs == (8, 16, 32, 64, 128)  # around the last traced length
    with pytest.raises(ValueError, match='k'):
        selection.fsp_inputs(available, 2, ttft)


def test_fsp_takes_the_midpoint_when_one_exists():
    """With a gap between the boundary lengths and odd k, the index midpoint is chosen."""
    available = (10, 20, 30, 40, 80, 160, 320)
    slow = {10: 1.0, 20: 1.0}

    def ttft(n):
        return slow.get(n, n / 1000.0)
    inputs, trace = selection.fsp_inputs(available, 5, ttft)
    assert trace == (320, 160, 80, 40, 20)
    assert inputs == (10, 20, 30, 40, 80)


def test_timebill_ls_recovers_eq4_from_five_probes():
    """Noise-free Eq. 4 probes give back the coefficients; the model predicts any cell."""
    probes = [eq4_probe(n, o) for n, o in ((16, 8), (64, 32), (128, 8), (512, 64), (2048, 16))]
    model = TimeBillLeastSquares().fit(probes)
    for name in COEFFICIENT_NAMES:
        assert getattr(model.coefficients, name) == pytest.approx(getattr(EQ4, name), rel=1e-6)
    assert model.e2e_s(4096, 192) == pytest.approx(eq4_probe(4096, 192).e2e_s, rel=1e-9)
    assert model.e2e_s(300, 20) == pytest.approx(EQ4.e2e_s(300, 0.0, 20), rel=1e-9)


def test_linear_regression_is_exact_on_linear_data():
    """LR fits L = w0 + w1 n_in + w2 n_out exactly when the data are that plane."""
    probes = [Probe(n, o, 0.01 + 0.002 * n, (0.05,) * (o - 1)) for n, o in
              ((16, 8), (64, 4), (256, 16), (512, 2))]
    model = LinearRegression().fit(probes)
    assert model.e2e_s(1000, 10) == pytest.approx(0.01 + 0.002 * 1000 + 0.05 * 9, rel=1e-6)
    with pytest.raises(ValueError, match='>= 3 probes'):
        LinearRegression().fit(probes[:2])


def test_section_tps_interpolates_and_extrapolates():
    """Prefill passes through every probe, end slopes beyond; one decode slope."""
    probes = [Probe(100, 3, 1.0, (0.1, 0.1)), Probe(200, 5, 3.0, (0.1,) * 4),
              Probe(400, 2, 4.0, (0.1,))]
    model = SectionTps().fit(probes)
    assert model.prefill_s([100, 150, 200, 300, 400]).tolist() == pytest.approx(
        [1.0, 2.0, 3.0, 3.5, 4.0])
    assert model.prefill_s(600) == pytest.approx(5.0) and model.prefill_s(50) == pytest.approx(0)
    assert model.e2e_s(200, 11) == pytest.approx(3.0 + 10 * 0.1)


def test_simfli_lm_follows_eq1_and_eq2():
    """Coefficients are mean inverse TPS per phase; C makes the mean error on probes 0."""
    probes = [Probe(100, 10, 0.5, (0.1,) * 9), Probe(400, 20, 1.0, (0.12,) * 19)]
    model = SimFLiLinear().fit(probes)
    coef_prefill = np.mean([0.5 / 100, 1.0 / 400])
    coef_decode = np.mean([0.9 / 10, 19 * 0.12 / 20])
    assert model.prefill_s(1000) == pytest.approx(coef_prefill * 1000)
    assert model.step_s(5) == pytest.approx(coef_decode)
    residuals = [p.e2e_s - model.e2e_s(p.n_in, p.n_out) for p in probes]
    assert np.mean(residuals) == pytest.approx(0.0, abs=1e-12)


def test_simfli_sam_fits_a_saturating_prefill():
    """Eq. 3's TPS = a n / (b + n) is recovered; prefill time (b + n) / a follows."""
    n_in = np.array([16.0, 64.0, 128.0, 512.0, 2048.0])
    a, b = fit_saturating_tps(n_in, 600.0 * n_in / (90.0 + n_in))
    assert (a, b) == pytest.approx((600.0, 90.0), rel=1e-5)
    probes = [Probe(int(n), 4, (90.0 + n) / 600.0, (0.07,) * 3) for n in n_in]
    model = SimFLiSaturating().fit(probes)
    assert model.prefill_s(1000) == pytest.approx((90 + 1000) / 600, rel=1e-5)
    # Equal n_out on every probe: C makes the fit exact on them.
    assert model.e2e_s(64, 4) == pytest.approx(probes[1].e2e_s, rel=1e-6)


TINY_ARCH = Architecture(hidden=8, layers=2, heads=2, kv_heads=1, head_dim=4, ffn=16, vocab=10)


def test_roofline_counts_flops_and_bytes(tmp_path):
    """Hand-counted FLOPs and bytes of a tiny decoder; time is the larger of the two bounds."""
    # Per layer: q, o 8x8 (64 each), k, v 8x4 (32 each), MLP 3 x 8x16 (384): 576 values.
    assert TINY_ARCH.layer_params == 2 * 576
    assert TINY_ARCH.step_flops(3) == pytest.approx(2 * (1152 + 80) + 4 * 2 * 2 * 4 * 4)
    assert TINY_ARCH.prefill_flops(2) == pytest.approx(2 * 2 * 1152 + 4 * 2 * 2 * 4 * 3 + 160)
    assert TINY_ARCH.step_bytes(3) == pytest.approx(4 * (1232 + 2 * 2 * 1 * 4 * 3))
    compute_bound = Roofline(TINY_ARCH, Hardware(peak_flops=1.0, bandwidth_bps=1e12)).fit(())
    assert compute_bound.step_s(3) == pytest.approx(TINY_ARCH.step_flops(3))
    memory_bound = Roofline(TINY_ARCH, Hardware(peak_flops=1e12, bandwidth_bps=1.0)).fit(())
    assert memory_bound.prefill_s(2) == pytest.approx(TINY_ARCH.prefill_bytes(2))
    config = {'hidden_size': 8, 'num_hidden_layers': 2, 'num_attention_heads': 2,
              'num_key_value_heads': 1, 'intermediate_size': 16, 'vocab_size': 10}
    (tmp_path / 'config.json').write_text(json.dumps(config))
    assert Architecture.from_model_dir(tmp_path) == TINY_ARCH
    with pytest.raises(ValueError, match='peak_flops'):
        Hardware(peak_flops=0.0, bandwidth_bps=1.0)


def test_roofline_lr_rescales_the_analytic_time():
    """Measured = 3 x roofline + 0.2 s is recovered from two probes."""
    hardware = Hardware(peak_flops=1e6, bandwidth_bps=1e6)
    roof = Roofline(TINY_ARCH, hardware).fit(())

    def probe(n_in, n_out):
        steps = tuple(3 * float(roof.step_s(n)) for n in range(n_in, n_in + n_out - 1))
        return Probe(n_in, n_out, 3 * float(roof.prefill_s(n_in)) + 0.2, steps)
    model = RooflineRegression(TINY_ARCH, hardware).fit([probe(10, 4), probe(200, 8)])
    assert model.e2e_s(500, 30) == pytest.approx(probe(500, 30).e2e_s, rel=1e-6)


def test_evaluate_scores_against_other_repeats_and_discriminates():
    """Score Eq. 4 data: Eq. 4 fits near-perfect, SimFLi's linear prefill worse held out.

    Costs add up the probes each method measured.
    """
    grid = synthetic_grid(noise=0.002)
    methods = [ev.Method('ls5', TimeBillLeastSquares(), ev.EXPONENTIAL),
               ev.Method('full', TimeBillLeastSquares(), ev.FULL_GRID),
               ev.Method('sam-fsp', SimFLiSaturating(), ev.FSP),
               ev.Method('lm', SimFLiLinear(), ev.EXPONENTIAL)]
    results = ev.evaluate(grid, SMALL, methods, k=5)
    assert len(results) == 2 * len(methods)
    full, full_cost = ev.mean_scores(results, 'full')
    ls5, ls5_cost = ev.mean_scores(results, 'ls5')
    sam, _ = ev.mean_scores(results, 'sam-fsp')
    assert full['all']['r2'] > 0.999 and ls5['all']['r2'] > 0.999
    assert full['prefill_mape'] < 1.0 and ls5['step_mape'] < 1.0
    assert sam['heldout']['mape'] > 5 * ls5['heldout']['mape']
    assert full_cost > ls5_cost > 0
    r0 = [r for r in results if r.method == 'ls5' and r.repeat == 0][0]
    expected = sum(grid.probe(n, o, 0).e2e_s for n, o in zip(
        r0.inputs, selection.output_lengths(SMALL.probe_n_out, 5, 0)))
    assert r0.cost_s == pytest.approx(expected)


def test_scores_are_standard():
    """R^2, RMSE, MAE, MAPE on a hand example."""
    s = ev.scores([1.0, 2.0, 4.0], [1.0, 2.0, 3.0])
    assert s['rmse'] == pytest.approx(math.sqrt(1 / 3)) and s['mae'] == pytest.approx(1 / 3)
    assert s['r2'] == pytest.approx(1 - 1 / 2) and s['mape'] == pytest.approx(100 / 9)


def test_few_shot_probes_are_grid_cells():
    """The CLI's five probes are in-distribution cells of the default evaluation grid."""
    probes = few_shot_probes(8192)
    design = GridDesign()
    assert len(probes) == 5 and all(cell in design.cells('id') for cell in probes)
    assert [n for n, _ in probes] == [16, 64, 128, 512, 2048]
    assert max(n for n, _ in few_shot_probes(8192, max_tokens=600)) == 512
    with pytest.raises(ValueError, match='>= 3'):
        few_shot_probes(8192, max_tokens=40)


def test_few_shot_profile_writes_a_calibration(tmp_path):
    """Five noise-free probes recover Eq. 4; the file round-trips; cost is the probes' time."""
    engine = FakeProbeEngine()
    calibration = few_shot_profile(engine, clock=engine.clock)
    assert calibration.method == 'few_shot' and calibration.n_points == 10
    for name in COEFFICIENT_NAMES:
        assert getattr(calibration.coefficients, name) == pytest.approx(
            getattr(EQ4, name), rel=1e-5)
    assert calibration.prefill_mape_pct < 1e-3 and calibration.decode_mape_pct < 1e-3
    assert calibration.profiling_s == pytest.approx(engine.now)
    calibration.save(tmp_path / 'c.yaml')
    assert Calibration.load(tmp_path / 'c.yaml') == calibration


def test_few_shot_profile_respects_its_time_limit():
    """Probes expected to overrun are skipped; too few prompt lengths is a RuntimeError."""
    engine = FakeProbeEngine()
    calibration = few_shot_profile(engine, clock=engine.clock, time_limit_s=4.0)
    # The probes at 16 and 128 tokens, then 256 (prefill and one step) for the long end:
    # 2048 would overrun, and 512 and 64 no longer fit after it.
    assert [n for n, _ in calibration.prefill_points] == [16, 128, 256] and engine.now <= 4.0
    short = FakeProbeEngine()
    with pytest.raises(RuntimeError, match='3 prompt lengths'):
        few_shot_profile(short, clock=short.clock, time_limit_s=0.5)
    with pytest.raises(ValueError, match='time_limit_s'):
        few_shot_profile(FakeProbeEngine(), time_limit_s=0.0)


def test_a_short_time_limit_keeps_the_long_end():
    """The range's ends are measured first: 12 s keeps the 2048-token probe.

    Shortest first, the probes at 16, 64, 128 and 512 tokens (5.2 s) left too little for
    the 2048-token one (6.9 s), and the fit had no prompt past 512 tokens.
    """
    assert range_first([(64, 8), (16, 8), (2048, 8), (512, 8), (128, 8)]) == [
        (16, 8), (128, 8), (2048, 8), (512, 8), (64, 8)]
    engine = FakeProbeEngine()
    calibration = few_shot_profile(engine, clock=engine.clock, time_limit_s=12.0)
    assert [n for n, _ in calibration.prefill_points] == [16, 128, 2048, 64]
    assert engine.now <= 12.0
    assert calibration.coefficients.prefill_s(4096) == pytest.approx(EQ4.prefill_s(4096))
    # 8 s: 2048 would overrun; the longest length whose prefill and one step fit stands in.
    engine = FakeProbeEngine()
    calibration = few_shot_profile(engine, clock=engine.clock, time_limit_s=8.0)
    assert [n for n, _ in calibration.prefill_points] == [16, 128, 1536, 64]
    assert engine.calls[-2] == (1536, 2) and engine.now <= 8.0


def test_few_shot_profile_on_the_real_engine(make_tiny_engine):
    """The real engine (tiny model) calibrates from five probes with positive coefficients."""
    calibration = few_shot_profile(make_tiny_engine(), max_tokens=512)
    assert calibration.method == 'few_shot' and len(calibration.prefill_points) == 5
    assert calibration.coefficients.prefill_s(256) > 0 and calibration.coefficients.q > 0


def test_exceed_table_counts_goals_over_wcet():
    """Shares of goals over t^_WCET and with N > N^_W, per k."""
    co = TimingCoefficients(a=0.0, b=0.0, c=1.0, p=0.0, q=0.1)  # 1 s + 0.1 s per step
    goals = [GoalTiming('a', 10, 10, 10, 1.95), GoalTiming('b', 10, 10, 25, 3.5)]
    table = exceed_table(goals, co, n_max=40, k_values=(1, 2, 3))
    # k=1: WCET 1.9 s (both over, b longer); k=2: 2.9 s (b over); k=3: 3.9 s (none).
    assert table == {1: (1.0, 0.5), 2: (0.5, 0.5), 3: (0.0, 0.0)}
    with pytest.raises(ValueError, match='goal'):
        exceed_table([], co, 40)


def test_eq4_model_matches_timing_coefficients():
    """model_from_coefficients predicts what the server's Eq. 8 computes (alpha = 0)."""
    model = model_from_coefficients(EQ4)
    for n_x, n in ((1, 1), (100, 2), (3000, 150)):
        assert model.e2e_s(n_x, n) == pytest.approx(EQ4.e2e_s(n_x, 0.0, n), rel=1e-9)


def test_report_tables_and_plot(tmp_path):
    """The report scores every method, states the few-shot ratios and draws the figure."""
    from timebill_ros.latency import report
    grid = synthetic_grid(noise=0.002)
    hardware = Hardware(peak_flops=1e9, bandwidth_bps=1e9, measure_s=0.5)
    saved = {'few': Calibration(
        coefficients=EQ4, model_key='fake', device='cpu', dtype='float32', threads=0,
        prefill_mape_pct=None, decode_mape_pct=None, n_points=0, profiling_s=12.0,
        created='2026-11-21T00:00:00+00:00', method='few_shot', prefill_points=(),
        decode_points=())}
    data = report.build(grid, SMALL, TINY_ARCH, hardware, saved)
    assert set(data['methods']) == {m.name for m in report.methods(TINY_ARCH, hardware)}
    assert data['calibrations']['few']['scores']['all']['mape'] < 0.5  # the true model
    ratios = report.ratios(data)
    assert ratios['cost'] > 1 and 0.5 < ratios['mape'] < 2
    text = report.write(data, SMALL, str(tmp_path))
    assert '| SimFLi (LM+SAM+FSP) |' in text and 'Few-shot vs full grid' in text
    assert json.loads((tmp_path / 'report.json').read_text())['k'] == 5
    report.plot(data, grid, SMALL, TINY_ARCH, hardware, str(tmp_path / 'p.png'))
    assert (tmp_path / 'p.png').stat().st_size > 10000


def test_timed_probe_rejects_a_wrong_answer():
    """An engine returning a probe of other lengths is a RuntimeError."""
    from timebill_ros.engine.probe import timed_probe

    class Wrong:
        def measure_probe(self, n_in, n_out):
            return Probe(n_in + 1, n_out, 0.1, (0.1,) * (n_out - 1))
    with pytest.raises(RuntimeError, match='measure_probe'):
        timed_probe(Wrong(), 8, 2)


def test_cli_has_few_shot_and_latency_commands():
    """The --few-shot profile excludes --quick; latency has measure, report and wcet."""
    from timebill_ros.cli import build_parser
    parser = build_parser()
    args = parser.parse_args(['profile', '--few-shot', '--time-limit', '30'])
    assert args.few_shot and args.time_limit == 30.0
    with pytest.raises(SystemExit):
        parser.parse_args(['profile', '--few-shot', '--quick'])
    for command in ('measure', 'report', 'wcet'):
        assert callable(parser.parse_args(['latency', command]).func)
