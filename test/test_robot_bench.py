"""The robot-context benchmark's plan: items kept, runs interleaved, servers."""

import argparse

import pytest

from timebill_ros.bench import robot_bench
from timebill_ros.bench.robot_context import Item
from timebill_ros.bench.server_process import write_params


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
                     'timebill']
    sweep = robot_bench._method_servers(_args(k_sweep=True))
    assert [name for name, _ in sweep] == ['vanilla'] + [f'timebill-k{k}' for k in range(1, 9)]
    for name, flat in sweep:  # every server's parameters are accepted as the node reads them
        assert flat['prefix_cache.max_mb'] == robot_bench.PREFIX_MB
        write_params(tmp_path, name, flat, robot_bench.N_MAX)
    assert dict(sweep)['timebill-k3']['budget.pessimistic_factor'] == 3.0
    with pytest.raises(ValueError, match=r"unknown method\(s\) \['fast'\]"):
        robot_bench._method_servers(_args(methods='timebill,fast'))


def test_the_table_shows_intervals():
    lines = [{'policy': 'kill', 'fraction': 0.55, 'method': 'timebill', 'n_items': 60,
              'score': (0.5, 0.4, 0.6), 'completion': (0.9, 0.8, 0.95), 'mean_alpha': 0.7,
              'task_score': None}]
    table = robot_bench.report_lines(lines, 'run')
    assert table[-1] == ('| kill | 0.55 | timebill | 0.900 [0.800, 0.950] | '
                         '0.500 [0.400, 0.600] | - | 0.70 |')
