"""The robot-context benchmark's plan: items kept, runs interleaved, servers."""

import argparse
import json
import time

import numpy as np
import pytest

from timebill_ros.bench import robot_bench
from timebill_ros.bench.robot_context import Item
from timebill_ros.bench.server_process import write_params
from timebill_ros.config import EngineConfig, ServerConfig


def _items(contexts=3, per_context=4):
    return [Item(f'c{c}/q{q}', f'c{c}', f'context {c}', f'question {q}', 1000)
            for c in range(contexts) for q in range(per_context)]


def test_short_vanilla_answers_are_left_out_and_contexts_share_what_is_kept():
    items = _items()
    tokens = {'c0': [10, 80, 90, 100], 'c1': [70, 256, 63, 64], 'c2': [5, 6, 7, 200]}
    vanilla = {item.item_id: {'tokens': tokens[item.context_id][int(item.item_id[-1])]}
               for item in items}
    kept = robot_bench.select_items(items, vanilla)
    assert [item.item_id for item in kept] == ['c0/q1', 'c0/q2', 'c0/q3', 'c1/q0', 'c1/q1',
                                               'c1/q3', 'c2/q3']
    four = robot_bench.select_items(items, vanilla, n_items=4)
    assert [item.item_id for item in four] == ['c0/q1', 'c0/q2', 'c1/q0', 'c2/q3']
    assert robot_bench.select_items(items, vanilla, n_items=50) == kept


def test_every_method_plays_every_run_in_a_rotated_order():
    items = _items(contexts=2, per_context=2)
    methods = ['vanilla', 'alpha=0.5', 'timebill']
    plan = robot_bench.runs(items, (0.5, 1.0), ('kill', 'skip_next'), methods)
    assert len(plan) == 2 * 2 * 2
    assert [p[:3] for p in plan[:3]] == [('kill', 'c0', 0.5), ('kill', 'c0', 1.0),
                                         ('kill', 'c1', 0.5)]
    assert [p[3][0] for p in plan[:4]] == ['vanilla', 'alpha=0.5', 'timebill', 'vanilla']
    assert all(sorted(p[3]) == sorted(methods) for p in plan)
    assert all([i.context_id for i in p[4]] == [p[1]] * 2 for p in plan)


def _args(**kw):
    base = {'k_sweep': False, 'methods': ''}
    return argparse.Namespace(**{**base, **kw})


def test_the_servers_of_fig_7_and_of_the_k_sweep(tmp_path):
    names = [name for name, _ in robot_bench._method_servers(_args())]
    assert names == ['vanilla', 'alpha=0.25', 'alpha=0.5', 'alpha=0.75', 'alpha=0.95',
                     'timebill', 'timebill-online']
    online = dict(robot_bench._method_servers(_args()))['timebill-online']
    assert online['budget.checkpoint_tokens'] == 16 and online['predictor.kind'] == 'rlp'
    assert 'predictor.decode_readout' not in online  # the server's default (off)
    decode = dict(robot_bench._method_servers(_args(methods='timebill-online-decode')))
    assert decode['timebill-online-decode']['predictor.decode_readout'] is True
    prefill = dict(robot_bench._method_servers(_args(methods='timebill-online-prefill')))
    assert list(prefill) == ['vanilla', 'timebill-online-prefill']
    assert prefill['timebill-online-prefill']['predictor.decode_readout'] is False
    write_params(tmp_path, 'timebill-online-prefill', prefill['timebill-online-prefill'],
                 robot_bench.N_MAX)
    write_params(tmp_path, 'timebill-online', online, robot_bench.N_MAX)
    sweep = robot_bench._method_servers(_args(k_sweep=True))
    assert [name for name, _ in sweep] == ['vanilla'] + [f'timebill-k{k}' for k in range(1, 9)]
    for name, flat in sweep:  # every server's parameters are accepted as the node reads them
        assert flat['prefix_cache.max_mb'] == robot_bench.PREFIX_MB
        assert flat['engine.prefill_dtype'] == 'float32'  # logits whatever the chunk plan
        write_params(tmp_path, name, flat, robot_bench.N_MAX)
    assert dict(sweep)['timebill-k3']['budget.pessimistic_factor'] == 3.0
    assert dict(sweep)['timebill-k3']['budget.upper_quantile'] == 0.0  # k in N^_W
    with pytest.raises(ValueError, match=r"unknown method\(s\) \['fast'\]"):
        robot_bench._method_servers(_args(methods='timebill,fast'))


def test_the_table_shows_intervals():
    lines = [{'policy': 'kill', 'fraction': 0.55, 'method': 'timebill', 'n_items': 60,
              'score': (0.5, 0.4, 0.6), 'completion': (0.9, 0.8, 0.95), 'mean_alpha': 0.7,
              'task_score': None, 'per_completed': 0.556}]
    table = robot_bench.report_lines(lines, 'run')
    assert table[-1] == ('| kill | 0.55 | timebill | 0.900 [0.800, 0.950] | '
                         '0.500 [0.400, 0.600] | 0.556 | - | 0.70 |')


def test_every_server_serves_the_file_given_with_model():
    served = robot_bench._method_servers(_args(model='/opt/models/other.gguf'))
    assert {flat['engine.model_path'] for _, flat in served} == {'/opt/models/other.gguf'}
    assert {flat['engine.model_path'] for _, flat in robot_bench._method_servers(_args())} == {''}
    assert robot_bench._served_config('/opt/models/other.gguf').engine.model_path == (
        '/opt/models/other.gguf')


def test_the_k_sweep_given_a_vanilla_pass_starts_no_vanilla_server():
    sweep = robot_bench._method_servers(_args(k_sweep=True, vanilla='robot_bench_vanilla.json'))
    assert [name for name, _ in sweep] == [f'timebill-k{k}' for k in range(1, 9)]


def test_servers_start_in_groups_and_the_vanilla_pass_runs_once(tmp_path, monkeypatch):
    started, played = [], []
    monkeypatch.setattr(robot_bench, 'start_servers', lambda stack, methods, *a: (
        started.append([name for name, _ in methods]) or [(n, n) for n, _ in methods]))
    monkeypatch.setattr(robot_bench, 'warm_contexts', lambda *a: None)
    vanilla = {item.item_id: {'tokens': 100, 'seconds': 1.0} for item in _items()}
    passes = []
    monkeypatch.setattr(robot_bench, 'vanilla_pass',
                        lambda client, *a: passes.append(client) or vanilla)
    retimed = []
    monkeypatch.setattr(robot_bench, 'play_all', lambda clients, *a, retime: (
        played.append([n for n, _ in clients]) or retimed.append(retime)
        or [{'method': n} for n, _ in clients]))
    methods = [('vanilla', {})] + [(f'timebill-k{k}', {}) for k in range(1, 9)]
    plan = {'n_items': 0, 'fractions': (0.95,), 'policies': ['kill']}
    got, chosen, rows = robot_bench._play_groups(methods, 4, None, _items(), None, plan,
                                                 tmp_path / 'k', lambda phase: None, print)
    assert started == played == [['vanilla', 'timebill-k1', 'timebill-k2', 'timebill-k3'],
                                 ['timebill-k4', 'timebill-k5', 'timebill-k6', 'timebill-k7'],
                                 ['timebill-k8']]
    assert passes == ['vanilla'] and got == vanilla and len(chosen) == 12
    assert retimed == [False] * 3  # groups share the pass's t_v
    assert [row['method'] for row in rows] == [name for name, _ in methods]
    assert (tmp_path / 'k_vanilla.json').exists()


class TimedServer:
    """Answers every goal at once with a result that took ``seconds`` (a set t_v)."""

    def __init__(self, seconds, response='a b c'):
        self.seconds, self.response, self.budgets = seconds, response, []

    def run(self, goal):
        from timebill_ros.action import Instruct
        from timebill_ros.ros.conversions import duration_to_s, s_to_duration
        self.budgets.append(round(duration_to_s(goal.time_budget), 3))
        return Instruct.Result(status=Instruct.Result.COMPLETED, response=self.response,
                               total_time=s_to_duration(self.seconds)), None


def test_each_contexts_budgets_come_from_vanilla_re_timed_before_its_runs():
    """The pass said 1.0 s; the machine now takes 1.2 s: the budgets are f x 1.2 s."""
    items = _items(contexts=2, per_context=2)
    vanilla = {item.item_id: {'tokens': 100, 'seconds': 1.0, 'response': 'a b c'}
               for item in items}
    servers = {'vanilla': TimedServer(1.2), 'timebill': TimedServer(0.5)}
    said = []
    rows = robot_bench.play_all(list(servers.items()), items, vanilla, (0.5, 1.25), ['kill'],
                                128, said.append)
    # Per context: 2 re-timing goals (600 s), then 2 items x 2 fractions.
    assert servers['vanilla'].budgets[:2] == [600.0, 600.0]
    assert servers['timebill'].budgets == [0.6, 0.6, 1.5, 1.5] * 2
    assert {row['vanilla_s'] for row in rows} == {1.2} and len(rows) == 16
    assert said.count('  re-timed Vanilla on c0: 1.20 x the pass') == 1
    # Started in groups (the k sweep), or without a Vanilla server: the pass's t_v.
    servers = {'timebill': TimedServer(0.5)}
    rows = robot_bench.play_all(list(servers.items()), items, vanilla, (0.5,), ['kill'], 128,
                                said.append)
    assert servers['timebill'].budgets == [0.5] * 4 and rows[0]['vanilla_s'] == 1.0


def test_a_timebill_method_without_its_trained_predictor_is_refused(tmp_path):
    methods = robot_bench._method_servers(_args())
    config = ServerConfig(engine=EngineConfig(model_cache_dir=str(tmp_path)))
    with pytest.raises(FileNotFoundError, match='make predictor'):
        robot_bench.require_predictor(methods, config)
    fixed = [(name, flat) for name, flat in methods if name.startswith('alpha')]
    robot_bench.require_predictor(fixed, config)  # no TimeBill method: nothing needed


def _job(method, item, alpha, n_hat, wcet_s, total_s, status=1, met=True, queue_s=0.0):
    return {'method': method, 'policy': 'kill', 'fraction': 0.6, 'item': item,
            'alpha': alpha, 'decided': wcet_s > 0, 'predicted_tokens': n_hat,
            'predicted_wcet_s': wcet_s, 'total_s': total_s, 'queue_s': queue_s,
            'status': status, 'deadline_met': met, 'response': 'x', 'predictor': 'rlp (onnx)'}


def test_the_diagnostics_compare_each_decision_with_the_vanilla_truth():
    vanilla = {'a': {'tokens': 100, 'seconds': 2.0}, 'b': {'tokens': 200, 'seconds': 4.0},
               'c': {'tokens': 50, 'seconds': 1.0}}
    rows = [_job('timebill', 'a', 0.0, 150, 3.0, 1.9),
            _job('timebill', 'b', 0.5, 100, 2.0, 2.5, queue_s=0.4),  # its run 2.1 s > 2.0 s
            _job('timebill', 'c', 0.0, 0, 0.0, 0.0, status=4, met=False),  # refused
            _job('alpha=0.5', 'a', 0.5, 256, 5.0, 1.0)]
    (line,) = robot_bench.timebill_diagnostics(rows, vanilla)
    assert (line['method'], line['n'], line['predictor']) == ('timebill', 2, 'rlp')
    assert line['evicted'] == 0.5 and line['mean_alpha'] == 0.25
    assert line['n_ratio'] == pytest.approx((1.5 + 0.5) / 2)
    assert line['n_mae'] == pytest.approx(75.0)
    assert line['wcet_ratio'] == pytest.approx((1.5 + 0.5) / 2)
    assert line['coverage'] == 0.5 and line['coverage_with_queue'] == 0.5
    assert line['refused'] == pytest.approx(1 / 3)
    table = robot_bench.diagnostics_lines([line])
    assert table[-1] == ('| kill | 0.60 | timebill | 2 | 0.33 | 0.50 | 0.25 | rlp | 1.00 | '
                         '75.0 | 1.00 | 0.50 | 0.50 |')
    waited = [dict(row, queue_s=0.6) if row['item'] == 'b' else row for row in rows]
    (line,) = robot_bench.timebill_diagnostics(waited, vanilla)  # run 1.9 s: within 2.0 s
    assert line['coverage'] == 1.0 and line['coverage_with_queue'] == 0.5
    old_rows = [{k: v for k, v in row.items() if k != 'queue_s'} for row in rows]
    (line,) = robot_bench.timebill_diagnostics(old_rows, vanilla)  # rows without queue_s
    assert line['coverage'] is None and line['coverage_with_queue'] == 0.5


def test_the_drift_table_compares_vanilla_with_the_t_v_of_its_budgets():
    vanilla = {'a': {'tokens': 100, 'seconds': 2.0}, 'b': {'tokens': 200, 'seconds': 4.0},
               'c': {'tokens': 90, 'seconds': 1.0}}
    rows = [dict(_job('vanilla', 'a', 0.0, 0, 0.0, 2.6, queue_s=0.1), vanilla_s=2.0),
            dict(_job('vanilla', 'b', 0.0, 0, 0.0, 6.0), vanilla_s=5.0),  # re-timed slower
            dict(_job('vanilla', 'c', 0.0, 0, 0.0, 0.6, status=2, met=False), vanilla_s=1.0),
            _job('timebill', 'a', 0.5, 100, 2.0, 1.0)]
    (line,) = robot_bench.vanilla_drift(rows, vanilla)
    assert (line['policy'], line['fraction'], line['n'], line['completed']) == ('kill', 0.6, 3, 2)
    assert line['run_ratio'] == pytest.approx(1.2)  # runs 1.25, 1.2, 0.6 of their t_v
    assert line['retime_ratio'] == pytest.approx(1.0)  # 1.0, 1.25, 1.0 of the pass
    unretimed = [{k: v for k, v in row.items() if k != 'vanilla_s'} for row in rows]
    (line,) = robot_bench.vanilla_drift(unretimed, vanilla)
    assert line['run_ratio'] == pytest.approx(1.25) and line['retime_ratio'] == 1.0
    table = robot_bench.drift_lines([line])
    assert table[-1] == '| kill | 0.60 | 3 | 2 | 1.25 | 1.00 |'
    assert robot_bench.drift_lines(robot_bench.vanilla_drift(rows[3:], vanilla)) == []


def test_the_selection_names_the_short_items_and_the_cap():
    vanilla = {f'i{n}': {'tokens': tokens} for n, tokens in enumerate((10, 70, 80, 90, 63))}
    assert robot_bench.selection_text(vanilla, ['i1', 'i2']) == (
        '2 of 5 items kept: 2 answered in fewer than 64 tokens left out, 1 more cut by --items')


class ScriptedClient:
    """Stands in for the action client in the stream's release schedule only.

    Each job is busy for its scripted seconds after the previous one ends (one server).
    """

    def __init__(self, busy_s):
        self.busy_s = list(busy_s)
        self.sent, self.ends = [], []

    def send(self, goal):
        now = time.monotonic()
        start = max([now] + self.ends[-1:])
        self.ends.append(start + self.busy_s[len(self.sent)])
        self.sent.append(now)
        return len(self.sent) - 1

    def finished(self, handle):
        return time.monotonic() >= self.ends[handle]

    def result(self, handle, timeout_s=None):
        time.sleep(max(0.0, self.ends[handle] - time.monotonic()))
        return handle, 4


def test_the_skip_next_stream_elides_only_idle_time():
    from timebill_ros.bench.timebill import _stream
    jobs = [('a', 'p', 0.4), ('b', 'p', 0.4), ('c', 'p', 0.4), ('d', 'p', 0.4)]
    busy = [0.05, 0.6, 0.05, 0.05]  # b overruns its period: c is due while it runs
    periodic, elided = ScriptedClient(busy), ScriptedClient(busy)
    _stream(periodic, jobs, 2, 8)
    _stream(elided, jobs, 2, 8, elide_idle=True)
    gaps = lambda client: np.diff(np.array(client.sent) - client.sent[0])  # noqa: E731
    assert gaps(periodic) == pytest.approx([0.4, 0.4, 0.4], abs=0.03)
    # a ends at 0.05: b is released then; b is busy past c's release (0.45), so c keeps
    # its period; c ends at 0.70 (after b), before d's release at 0.85: d goes at once.
    assert gaps(elided) == pytest.approx([0.05, 0.4, 0.25], abs=0.03)


def _online_run(online_answer):
    """Return a run of 4 items at two budgets: Vanilla, TimeBill (a b) and timebill-online."""
    items = ['i1', 'i2', 'i3', 'i4']
    vanilla = {i: {'response': 'a b c d', 'tokens': 80, 'seconds': 1.0} for i in items}
    rows = []
    for fraction in (0.95, 1.25):
        for method, answer in (('vanilla', 'a b c d'), ('timebill', 'a b'),
                               ('timebill-online', online_answer)):
            for item in items:
                rows.append({'method': method, 'policy': 'kill', 'fraction': fraction,
                             'item': item, 'status': 1, 'deadline_met': True,
                             'response': answer, 'alpha': 0.0, 'decided': True,
                             'predicted_wcet_s': 1.5, 'total_s': 1.2, 'queue_s': 0.2,
                             'checkpoint_wcet_s': [1.5, 1.1], 'rest_error_tokens': 2,
                             'message': 'completed (end of answer), on time'
                             if item == 'i1' else
                             'completed (max_new_tokens reached), on time'})
    return {'rows': rows, 'vanilla': vanilla, 'items': items}


def test_the_repeats_check_and_paired_difference_of_timebill_online(tmp_path):
    from timebill_ros.bench import robot_repeats
    similarity = robot_repeats._rouge_l_scorer()
    good, bad = _online_run('a b c d'), _online_run('a b')
    verdict = robot_repeats.online_check(robot_bench.score_lines(good, similarity)[0])
    assert [v['holds'] for v in verdict] == [True, True]
    assert verdict[-1]['vanilla_gap'] == 0.0 and verdict[0]['vanilla_gap'] is None
    verdict = robot_repeats.online_check(robot_bench.score_lines(bad, similarity)[0])
    # 0.95: below Vanilla's [1, 1]; 1.25: 0.333 below Vanilla, not within 0.01.
    assert [v['holds'] for v in verdict] == [False, False]
    (_, _, mean, low, high), _ = robot_repeats.paired_differences(good, similarity)
    assert mean == pytest.approx(1 - 2 / 3) and low == high == mean  # 'a b' scores 2/3
    line, _, pooled = robot_repeats.wcet_lines(good)
    assert line[2:] == (4, 1.0, 1.5, 1.1)  # run = 1.2 - 0.2 s
    assert pooled == ('kill', None, 8, 1.0, 1.5, 1.1)  # both budgets' jobs
    # A run with timebill-online-prefill rows gets the decode readout's paired difference.
    good['rows'] += [dict(row, method='timebill-online-prefill', response='a b')
                     for row in good['rows'] if row['method'] == 'timebill']
    paths = []
    for name, run in (('r1', good), ('r2', bad)):
        paths.append(tmp_path / f'{name}.json')
        paths[-1].write_text(json.dumps(run))
    text = robot_repeats.report(paths, tmp_path / 'out')
    effect = text.index("## Paired difference timebill-online - timebill-online-prefill (the "
                        "decode readout's effect) (per item), per repeat")
    assert text[effect + 4:effect + 6] == ['| 1 | kill | 0.95 | +0.333 [+0.333, +0.333] |',
                                           '| 1 | kill | 1.25 | +0.333 [+0.333, +0.333] |']
    assert '| 2 | kill | all | 8 | 1.000 | 1.50 | 1.10 |' in text
    # ... and split by how the answers ended (item i1 by EOS, the others at N_max).
    assert '| 2 | kill | all | eos | 2 | 1.000 | 1.50 | 1.10 | 2 of 2 | 2 |' in text
    assert '| 2 | kill | 0.95 | max_tokens | 3 | 1.000 | 1.50 | 1.10 | 3 of 3 | 2 |' in text
    assert '| kill | 0.95 | timebill-online | 1.000 [1.000, 1.000] | 0.667 [0.667, 0.667] | '\
        '0.333 | 1.00 / 1.00 |' in text
