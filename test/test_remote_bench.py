"""`timebill remotebench`'s summary: on time, wasted server time, refusals, kills, coverage."""

import json

from timebill_ros.bench import remote
from timebill_ros.bench.remote import N_MAX, report, Row, summarize


def _row(method, status, on_time, tokens=10, wasted_s=0.0, wall_s=0.2, sent=0, wcet=0.0,
         execution=0.0):
    return Row(method, 0.5, 0, 0.25, on_time, status, tokens, 20, wasted_s,
               tokens if wasted_s else 0, wall_s, sent, wcet, execution)


def test_the_summary_counts_each_method_apart():
    rows = [_row('node', 'COMPLETED', True, tokens=10, sent=12, wcet=0.3, execution=0.2),
            _row('node', 'COMPLETED', True, tokens=20, sent=N_MAX, wcet=0.1, execution=0.2),
            _row('node', 'REJECTED', False, tokens=0, wall_s=0.006),
            _row('node', 'KILLED', False, tokens=5, wasted_s=0.26, wall_s=0.258, sent=9),
            _row('client', 'TIMED_OUT', False, tokens=7, wasted_s=0.25),
            _row('client', 'COMPLETED', True, tokens=20)]
    node, client = summarize(rows)
    assert (node['goals'], node['on_time'], node['refused'], node['killed']) == (4, 2, 1, 1)
    assert node['deadline_met'] == 2 and client['deadline_met'] is None
    assert node['on_time_tokens'] == (10, 15, 20) and node['on_time_one_token'] == 0
    assert node['token_share'] == 0.75  # 10 and 20 of 20 free tokens
    assert node['wasted_s'] == 0.26 and node['wasted_tokens'] == 5
    assert node['refusal_ms_max'] == 6.0
    assert round(node['kill_late_ms_max'], 6) == 8.0
    assert node['wcet_coverage'] == 0.5 and node['capped'] == 2
    assert node['wcet_coverage_send_to_result'] == 0.5  # 0.3 >= 0.2; 0.1 < 0.2
    assert (client['on_time'], client['wasted_tokens'], client['wcet_coverage']) == (1, 7, None)
    text = report([node, client], {'command': 'c', 'host': 'h', 'date': 'd', 'goals': 1,
                                   'llama': 'v', 'threads': 2})
    assert ('| 0.50 t_free | node | 2/4 | 2/4 | 10 / 15 / 20 (0) | 0.75 | 0.3 | 5 | 1 (6.0) | '
            '1 (8.0) | 2 | 0.50 / 0.50 |') in text


def test_an_answer_the_node_met_that_reached_the_client_late_is_not_on_time():
    # deadline_met by the node's clock, but the result came 0.7 ms after the budget (0.25 s).
    late = _row('node', 'COMPLETED', True, tokens=1, wall_s=0.2507, sent=1, wcet=0.3,
                execution=0.004)
    early = _row('node', 'COMPLETED', True, tokens=1, wall_s=0.01, sent=1, wcet=0.3,
                 execution=0.004)
    node, = summarize([late, early])
    assert (node['on_time'], node['deadline_met'], node['on_time_one_token']) == (1, 2, 1)
    assert node['wasted_s'] == 0.004 and node['wasted_tokens'] == 1
    assert node['wcet_coverage'] == 1.0 and node['wcet_coverage_send_to_result'] == 1.0


def test_report_mode_rebuilds_the_table_from_the_rows_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(remote, 'plot', lambda table, path: path.write_text('png'))
    rows = [_row('node', 'COMPLETED', True, tokens=1, wall_s=0.2507, sent=1, wcet=0.3,
                 execution=0.004), _row('client', 'COMPLETED', True, tokens=20)]
    meta = {'command': 'timebill remotebench --out X', 'host': 'h', 'date': 'd', 'goals': 1,
            'llama': 'v', 'threads': 2}
    raw = tmp_path / 'remote.json'
    raw.write_text(json.dumps({'meta': meta, 'free': [], 'table': [{'stale': True}],
                               'rows': [remote.dataclasses.asdict(r) for r in rows]}))
    assert remote.report_from(raw) == 0
    saved = json.loads(raw.read_text())
    assert saved['table'] == json.loads(json.dumps(summarize(rows)))
    assert saved['rows'] == [remote.dataclasses.asdict(r) for r in rows]
    text = (tmp_path / 'remote.md').read_text()
    assert f'Recompute: `timebill remotebench --report {raw}`' in text
    assert '| 0.50 t_free | node | 0/1 | 1/1 | - |' in text
