"""The scheduling benchmark's pure parts: workload subsets, traces, metrics, report."""

import argparse
import json

import numpy as np
import pytest

from timebill_ros.bench import server_process
from timebill_ros.bench.scheduling import capacity, methods, metrics, report, run, workload
from timebill_ros.training.dataset import Example
from timebill_ros.timing.model import TimingCoefficients


def _example(i, n_tokens, split='test', n_x=50):
    return Example(f'p-{i:04d}', 'plan', split, f'prompt {i}', n_tokens, n_tokens >= 128, n_x,
                   128)


def _pool(n=60):
    """Bimodal like the real corpus: short answers and answers capped at 128."""
    lengths = [2 + (i * 7) % 60 for i in range(n // 2)] + [128] * (n - n // 2)
    return [_example(i, length) for i, length in enumerate(lengths)]


def test_pool_is_the_test_split_joined_by_val_only_when_too_small():
    examples = {'test': [_example(i, 10) for i in range(30)],
                'val': [_example(100 + i, 20, 'val') for i in range(10)],
                'train': [_example(200, 5, 'train')]}
    assert len(workload.load_pool(goals=12, examples=examples)) == 30
    pool = workload.load_pool(goals=24, examples=examples)
    assert len(pool) == 40 and {e.split for e in pool} == {'test', 'val'}
    examples['test'][0] = _example(0, 10, n_x=3000)
    assert len(workload.load_pool(goals=12, max_prompt_tokens=1024,
                                  examples=examples)) == 29
    assert len(workload.load_pool(goals=12, max_prompt_tokens=0, examples=examples)) == 30
    with pytest.raises(ValueError, match='need more'):
        workload.load_pool(goals=50, examples=examples)


def test_val_pool_is_the_val_split_alone():
    examples = {'test': [_example(i, 10) for i in range(5)],
                'val': [_example(100 + i, 20, 'val') for i in range(30)]}
    pool = workload.load_pool(goals=12, examples=examples, split='val')
    assert len(pool) == 30 and {e.split for e in pool} == {'val'}
    with pytest.raises(ValueError, match='need more'):
        workload.load_pool(goals=40, examples=examples, split='val')
    with pytest.raises(ValueError, match='split must be'):
        workload.load_pool(goals=12, examples=examples, split='train')


def test_subsets_have_small_medium_large_variance_and_are_deterministic():
    pool = _pool()
    subsets = workload.make_subsets(pool, goals=24, seed=3)
    assert list(subsets) == ['small', 'medium', 'large']
    assert all(len(items) == 24 for items in subsets.values())
    for items in subsets.values():
        assert len({e.prompt_id for e in items}) == 24
    std = {name: workload.subset_stats(items)['std'] for name, items in subsets.items()}
    assert std['small'] < std['medium'] < std['large']
    large = sorted(e.n_tokens for e in subsets['large'])
    ranked = sorted(e.n_tokens for e in pool)
    assert large == ranked[:12] + ranked[-12:]
    median = np.median(ranked)
    assert all(abs(e.n_tokens - median) <= abs(o.n_tokens - median)
               for e in subsets['small'] for o in pool if o not in subsets['small'])
    again = workload.make_subsets(pool, goals=24, seed=3)
    assert {k: [e.prompt_id for e in v] for k, v in again.items()} == \
        {k: [e.prompt_id for e in v] for k, v in subsets.items()}
    other = workload.make_subsets(pool, goals=24, seed=4)
    assert [e.prompt_id for e in other['small']] != [e.prompt_id for e in subsets['small']]
    only = workload.make_subsets(pool, goals=12, seed=3, names=('large',))
    assert list(only) == ['large']
    with pytest.raises(ValueError, match='unknown subset'):
        workload.make_subsets(pool, names=('huge',))


def test_medium_subset_follows_the_pool_distribution():
    pool = [_example(i, i + 1) for i in range(96)]  # N = 1 .. 96
    medium = workload.make_subsets(pool, goals=24, seed=0, names=('medium',))['medium']
    lengths = [e.n_tokens for e in medium]
    # One prompt from each stratum of four consecutive lengths.
    assert [(n - 1) // 4 for n in lengths] == list(range(24))


def test_subsets_of_the_committed_lengths():
    pool = workload.load_pool(workload.DEFAULT_LENGTHS, goals=24)
    assert all(e.split == 'test' and e.n_prompt_tokens <= 1024 for e in pool)
    stats = {name: workload.subset_stats(items)
             for name, items in workload.make_subsets(pool, 24, seed=0).items()}
    assert stats['small']['std'] < stats['medium']['std'] < stats['large']['std']
    assert stats['large']['short'] == 12


def test_subset_stats_and_predicted_service_time():
    items = [_example(0, 2, n_x=40), _example(1, 128, n_x=60), _example(2, 30, n_x=50)]
    stats = workload.subset_stats(items)
    assert stats['mean'] == pytest.approx(160 / 3)
    assert (stats['min'], stats['max'], stats['median'], stats['capped']) == (2, 128, 30, 1)
    assert stats['short'] == 1 and stats['prompt_max'] == 60
    co = TimingCoefficients(a=0.0, b=0.001, c=0.1, p=0.0, q=0.02)
    assert workload.predicted_service_s(co, 100, 11) == pytest.approx(0.2 + 10 * 0.02)
    # N beyond N_max is cut to N_max.
    assert workload.predicted_service_s(co, 100, 500, n_max=128) == \
        pytest.approx(0.2 + 127 * 0.02)


def test_capacity_sample_spreads_over_predicted_times():
    predicted = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 8.0]
    sample = capacity.capacity_sample(predicted, 3)
    assert [predicted[i] for i in sample] == [1.0, 5.0, 9.0]
    assert sorted(capacity.capacity_sample(predicted, 10)) == list(range(7))
    assert capacity.capacity_sample(predicted, 1) == [0]


def test_service_fit_separates_scale_and_per_goal_overhead():
    predicted = [0.2, 0.2, 0.3, 4.0, 4.1, 4.6]
    measured = [1.5 * t + 0.2 for t in predicted]
    assert capacity.fit_service(predicted, measured) == (pytest.approx(1.5),
                                                         pytest.approx(0.2))
    # Too alike to separate, too few, or a negative term: the plain ratio.
    assert capacity.fit_service([4.0, 4.1, 4.5], [6.0, 6.2, 6.7]) == \
        (pytest.approx(18.9 / 12.6), 0.0)
    assert capacity.fit_service([1.0, 3.0], [1.5, 4.5]) == (pytest.approx(1.5), 0.0)
    assert capacity.fit_service([1.0, 2.0, 4.0], [0.5, 2.5, 6.5])[1] == 0.0
    with pytest.raises(ValueError):
        capacity.fit_service([1.0], [])


def test_capacity_is_one_over_the_fitted_mean_service_time():
    cap = capacity.estimate_capacity([1.0, 3.0], [1.5, 4.5], [1.0, 2.0, 3.0, 6.0])
    assert cap['ratio'] == pytest.approx(1.5) and cap['overhead_s'] == 0.0
    assert cap['service_mean_s'] == pytest.approx(1.5 * 3.0)
    assert cap['capacity_per_s'] == pytest.approx(1 / 4.5)
    assert cap['sample_measured_mean_s'] == pytest.approx(3.0)
    cap = capacity.estimate_capacity([0.2, 2.0, 4.0], [0.5, 3.2, 6.2], [0.2, 4.0])
    assert (cap['scale'], cap['overhead_s']) == (pytest.approx(1.5), pytest.approx(0.2))
    assert cap['service_mean_s'] == pytest.approx(1.5 * 2.1 + 0.2)
    assert capacity.budget_bases([0.2, 4.0], cap, 'model') == [0.2, 4.0]
    assert capacity.budget_bases([0.2, 4.0], cap, 'service') == \
        [pytest.approx(0.5), pytest.approx(6.2)]
    with pytest.raises(ValueError):
        capacity.budget_bases([1.0], cap, 'wall')


def test_traces_are_poisson_with_budgets_from_slack_and_common_across_loads():
    items = list(range(200))
    predicted = [1.0 + i % 5 for i in items]
    seed = workload.trace_seed(0, 'large', 1)
    slow = workload.make_trace(items, predicted, 0.5, (1.5, 4.0), seed)
    fast = workload.make_trace(items, predicted, 1.0, (1.5, 4.0), seed)
    assert sorted(g['index'] for g in slow) == items
    assert slow[0]['arrival_s'] == 0.0
    arrivals = [g['arrival_s'] for g in slow]
    assert arrivals == sorted(arrivals)
    assert np.mean(np.diff(arrivals)) == pytest.approx(2.0, rel=0.2)
    for goal in slow:
        assert 1.5 <= goal['slack'] <= 4.0
        assert goal['budget_s'] == pytest.approx(goal['slack'] * predicted[goal['index']],
                                                 abs=1e-3)
    # Same goals and factors at another load; arrival times scale with 1 / rate.
    assert [g['index'] for g in fast] == [g['index'] for g in slow]
    assert [g['budget_s'] for g in fast] == [g['budget_s'] for g in slow]
    assert [g['arrival_s'] for g in fast] == pytest.approx([t / 2 for t in arrivals])
    other = workload.make_trace(items, predicted, 0.5, (1.5, 4.0),
                                workload.trace_seed(0, 'large', 2))
    assert [g['index'] for g in other] != [g['index'] for g in slow]
    assert workload.make_trace(items, predicted, 0.5, (1.5, 4.0), seed) == slow
    with pytest.raises(ValueError):
        workload.make_trace(items, predicted, 0.0)


def test_rotate_and_method_selection():
    assert server_process.rotate('abc', 1) == ['b', 'c', 'a']
    assert server_process.rotate('abc', 5) == ['c', 'a', 'b']
    assert server_process.rotate([], 3) == []
    assert [m[0] for m in methods.selected_methods('')] == \
        ['fifo', 'edf', 'luf', 'muf', 'slack', 'up', 'up-1thread', 'up+offload',
         'up+consolidation', 'rt-lm', 'fifo+consolidation', 'fifo+continuous']
    assert [m[0] for m in methods.selected_methods('up, fifo')] == ['fifo', 'up']
    assert [m[0] for m in methods.selected_methods(('up+offload',))] == ['up+offload']
    with pytest.raises(ValueError, match='unknown method'):
        methods.selected_methods('lifo')


def test_up_alpha_sweep_methods():
    chosen = methods.selected_methods('up@2, fifo, up@0.5')
    assert [m[0] for m in chosen] == ['fifo', 'up@2', 'up@0.5']
    assert chosen[1][1] == {'scheduler.policy': 'up', 'scheduler.up_alpha': 2.0}
    for bad in ('up@', 'up@x', 'up@-0.5', 'up@nan', 'up@inf'):
        with pytest.raises(ValueError, match='up@ALPHA'):
            methods.selected_methods(bad)


def test_refused_parameters_skip_a_method_and_fifo_falls_back():
    def check(flat):
        if any(name.startswith('scheduler.') for name in flat):
            raise ValueError('unknown parameter(s): scheduler.policy')

    assert methods.method_params('edf', {'scheduler.policy': 'edf'}, check) == \
        (None, 'unknown parameter(s): scheduler.policy')
    flat, note = methods.method_params('fifo', {'scheduler.policy': 'fifo'}, check)
    assert flat == {} and 'server default' in note
    assert methods.method_params('up', {'x.y': 1}, lambda flat: None) == ({'x.y': 1}, '')


def _goal(status, total, met=True, queue=0.0, prefill=0.0, short=False, sent=0.0,
          schedule=None, executor='', **key):
    row = {'subset': 'large', 'load': 1.0, 'method': 'fifo', 'repeat': 0, 'status': status,
           'deadline_met': met, 'total_s': total, 'queue_s': queue, 'prefill_s': prefill,
           'short': short, 'sent_s': sent, 'schedule_s': schedule, 'executor': executor}
    row.update(key)
    return row


def test_cell_metrics():
    rows = [_goal(1, 2.0, queue=0.5, prefill=0.2, short=True, sent=0.0, executor='primary'),
            _goal(1, 4.0, met=False, queue=1.0, prefill=0.2, sent=1.0, executor='offload'),
            _goal(2, 3.0, met=False, queue=0.0, prefill=0.3, short=True, sent=2.0,
                  executor='primary'),
            _goal(4, 0.01, met=False, sent=3.0),  # rejected at admission: never ran
            _goal(metrics.NO_RESULT, 0.0, met=False, sent=4.0)]
    m = metrics.cell_metrics(rows)
    assert (m['goals'], m['met'], m['completed'], m['no_result']) == (5, 1, 2, 1)
    assert m['miss_rate'] == pytest.approx(0.8)
    assert m['miss_rate_short'] == pytest.approx(0.5) and m['short_goals'] == 2
    assert m['completion_rate'] == pytest.approx(0.4)
    assert m['resp_mean_done'] == pytest.approx(3.0)
    assert m['resp_max_done'] == pytest.approx(4.0)
    assert m['resp_p95_done'] == pytest.approx(2.0 + 0.95 * 2.0)
    assert m['resp_mean_all'] == pytest.approx((2.0 + 4.0 + 3.0 + 0.01) / 4)
    assert m['resp_max_all'] == pytest.approx(4.0)
    assert m['makespan_s'] == pytest.approx(5.0)  # first send 0, last result 1 + 4 = 2 + 3
    assert m['throughput_per_min'] == pytest.approx(60 * 2 / 5.0)
    assert m['queue_wait_mean'] == pytest.approx(0.5)  # the three that ran
    assert m['sched_overhead_ms'] is None and m['sched_overhead_pct'] is None
    assert m['admission_predict_ms'] is None
    assert m['offloaded'] == pytest.approx(1 / 3)
    only_long = metrics.cell_metrics([_goal(1, 1.0, schedule=0.002)])
    assert only_long['miss_rate_short'] is None and only_long['offloaded'] is None
    assert only_long['sched_overhead_ms'] == pytest.approx(2.0)
    assert only_long['sched_overhead_pct'] == pytest.approx(0.2)
    predicted = metrics.cell_metrics([
        _goal(1, 2.0, schedule=0.001, predict_s=0.05, at_admission=True),
        _goal(1, 3.0, schedule=0.003, predict_s=0.09, at_admission=False)])
    assert predicted['sched_overhead_ms'] == pytest.approx(2.0)
    assert predicted['sched_overhead_pct'] == pytest.approx(100 * 0.004 / 5.0)
    assert predicted['admission_predict_ms'] == pytest.approx(50.0)  # only the admission one
    assert m['batched'] is None and predicted['batched'] is None  # no batch sizes carried
    batches = metrics.cell_metrics([_goal(1, 1.0, batch_size=2), _goal(1, 1.0, batch_size=2),
                                    _goal(1, 1.0, batch_size=1), _goal(4, 0.0, sent=1.0)])
    assert batches['batched'] == pytest.approx(2 / 3)  # of the three that ran
    with pytest.raises(ValueError):
        metrics.cell_metrics([])


def test_summary_gives_mean_and_spread_over_repeats():
    rows = [_goal(1, 1.0, repeat=0), _goal(2, 1.0, met=False, repeat=0),
            _goal(1, 1.0, repeat=1), _goal(1, 3.0, repeat=1),
            _goal(1, 1.0, method='up', repeat=0), _goal(1, 1.0, method='up', load=0.5)]
    table = metrics.summarize(rows)
    assert [(e['load'], e['method'], e['repeats']) for e in table] == \
        [(0.5, 'up', 1), (1.0, 'fifo', 2), (1.0, 'up', 1)]
    fifo = table[1]
    assert fifo['miss_rate'][0] == pytest.approx(0.25)
    assert fifo['miss_rate'][1] == pytest.approx(np.std([0.5, 0.0], ddof=1))
    assert table[2]['miss_rate'] == (0.0, None)
    assert fifo['miss_rate_short'] == (None, None)


def _data():
    rows = []
    for method in ('fifo', 'up'):
        for load in (0.8, 1.2):
            for repeat in (0, 1):
                miss = method == 'fifo' and load > 1
                rows += [_goal(1, 2.0, method=method, load=load, repeat=repeat, short=True,
                               queue=0.1, prefill=0.1, executor='primary'),
                         _goal(2 if miss else 1, 5.0, met=not miss, method=method, load=load,
                               repeat=repeat, queue=0.4, prefill=0.2, sent=1.0,
                               executor='primary')]
    stats = {'goals': 2, 'mean': 65.0, 'std': 63.0, 'min': 2, 'max': 128, 'median': 65.0,
             'capped': 1, 'short': 1, 'prompt_mean': 50.0, 'prompt_max': 60}
    meta = {'command': 'timebill schedbench --quick', 'started': '2026-01-01T00:00:00',
            'runtime_s': 120.0, 'seed': 0, 'goals': 2, 'loads': [0.8, 1.2], 'repeats': 2,
            'slack': [1.5, 4.0], 'n_max': 128, 'max_prompt_tokens': 1024,
            'pool': '98 held-out prompts (test 98)', 'methods': ['fifo', 'up'],
            'skipped': {'up+offload': 'parameters refused'}, 'notes': {},
            'capacity_sample': 6, 'capacity_method': 'fifo',
            'calibration_report': 'TimeBill timing calibration', 'calibration_fit_pct': 40.0,
            'send_lag_max_s': 0.012,
            'subsets': {'large': {'stats': stats, 'predicted_mean_s': 3.0, 'prompt_ids': [],
                                  'capacity': capacity.estimate_capacity(
                                      [1.0, 5.0], [1.2, 6.0], [1.0, 5.0])}}}
    return {'meta': meta, 'rows': rows}


def test_report_has_the_command_a_table_per_subset_and_the_warnings():
    text = report.report(_data())
    assert text.splitlines()[2] == 'Command: `timebill schedbench --quick`'
    assert '## Subset large' in text
    assert '| 1.20 | fifo | 0.50 ± 0.00 | 0.00 ± 0.00 | 0.50 ± 0.00 | 2.00 ± 0.00 |' in text
    assert '| 1.20 | up | 0.00 ± 0.00 | 0.00 ± 0.00 | 1.00 ± 0.00 | 3.50 ± 0.00 |' in text
    assert '| large | 2 | 65.0 | 63.0 | 2-128 | 1 | 1 | 50 (60) | 3.00 | 3.60 | 1.20 | ' \
        '1.20 t^ + 0.00 s | 0.278 |' in text
    assert 'budget = t^_e2e (calibration) x slack' in text
    assert 'Skipped up+offload: parameters refused' in text
    assert 'held-out MAPE is 40 %' in text
    assert 'Largest lag' in text and '12 ms' in text
    assert 'overrun policy Kill;' in text  # runs before --overrun were Kill
    data = _data()
    data['meta']['overrun'] = 'skip_next'
    assert 'overrun policy Skip-Next (a running goal finishes late' in report.report(data)


def test_outputs_are_written_and_rerendered_from_json(tmp_path):
    data = _data()
    report.write_outputs(data, tmp_path / 'a', progress=lambda text: None)
    for name in ('schedbench_raw.json', 'schedbench.md', 'calibration.txt'):
        assert (tmp_path / 'a' / name).exists()
    assert (tmp_path / 'a' / 'schedbench.png').stat().st_size > 1000
    args = argparse.Namespace(from_json=str(tmp_path / 'a' / 'schedbench_raw.json'),
                              out=str(tmp_path / 'b'))
    assert run.run_schedbench(args, progress=lambda text: None) == 0
    assert (tmp_path / 'b' / 'schedbench.md').read_text() == \
        (tmp_path / 'a' / 'schedbench.md').read_text()
    assert json.loads((tmp_path / 'b' / 'schedbench_raw.json').read_text()) == data


def test_quick_settings_and_explicit_options_win():
    def args(**kw):
        base = {'quick': False, 'subsets': '', 'loads': '', 'goals': None, 'repeats': None,
                'methods': '', 'slack': '1.5,4.0'}
        return argparse.Namespace(**{**base, **kw})

    full = run._resolve(args())
    assert full['subsets'] == ('small', 'medium', 'large')
    assert (full['loads'], full['goals'], full['repeats']) == ((0.5, 0.8, 1.0, 1.2), 24, 2)
    assert len(full['methods']) == 12 and full['slack'] == (1.5, 4.0)
    quick = run._resolve(args(quick=True))
    assert quick['subsets'] == ('large',) and quick['loads'] == (0.8, 1.2)
    assert (quick['goals'], quick['repeats']) == (12, 1)
    assert [m[0] for m in quick['methods']] == ['fifo', 'up']
    mine = run._resolve(args(quick=True, methods='fifo', loads='1.0', goals=6))
    assert [m[0] for m in mine['methods']] == ['fifo']
    assert (mine['loads'], mine['goals']) == ((1.0,), 6)
    with pytest.raises(ValueError, match='slack'):
        run._resolve(args(slack='4,1.5'))


def test_the_benchmark_refuses_to_run_without_the_rlp(tmp_path):
    from timebill_ros import params
    missing = tmp_path / 'none.onnx'
    config = params.config_from_flat({'predictor.model_file': str(missing)})
    assert run.missing_predictor(config) == \
        f'no RLP at {missing} (make predictor builds it)'
    missing.write_bytes(b'onnx')
    assert run.missing_predictor(config) is None
    assert run.missing_predictor(
        params.config_from_flat({'predictor.kind': 'fallback'})) is None
