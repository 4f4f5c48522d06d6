"""``timebill soak``: its load plan, its per-minute figures and its report (no node process).

The real soak runs only when TIMEBILL_SOAK_MINUTES is set (``make soak SOAK_MINUTES=3``).
"""

import collections
import math
import os
import subprocess
import sys

import pytest

from timebill_ros.bench import soak, soak_report
from timebill_ros.server.status import (CANCELED, COMPLETED, ERROR_INACTIVE, KILLED,
                                        POLICY_DEFAULT, REJECTED, SKIPPED, STATUS_NAMES)

PLAN_S = 1800.0  # ~2,000 goals at 1 goal/s plus the bursts


@pytest.fixture(scope='module')
def plan():
    return soak.make_plan(0, PLAN_S, 1.0)


def test_the_plan_is_the_same_for_a_seed_and_differs_between_seeds(plan):
    again = soak.make_plan(0, PLAN_S, 1.0)
    other = soak.make_plan(1, PLAN_S, 1.0)
    assert again[0] == plan[0]
    assert _comparable(again[1]) == _comparable(plan[1])
    assert _comparable(other[1]) != _comparable(plan[1])
    assert other[0] != plan[0]


def _comparable(goals):
    """Return the goals' fields with NaN as text (NaN != NaN)."""
    return [{k: ('nan' if isinstance(v, float) and math.isnan(v) else v)
             for k, v in g.fields().items()} for g in goals]


def test_the_plan_has_the_stated_mix(plan):
    contexts, goals = plan
    n = len(goals)
    assert 1900 <= n <= 2100
    kinds = collections.Counter(g.kind.split(':')[0] for g in goals)
    for kind, share in (('bad', 0.08), ('json', 0.10), ('chat', 0.10), ('followup', 0.30),
                        ('plain', 0.42)):
        assert abs(kinds[kind] / n - share) < 0.03, (kind, kinds[kind] / n)
    canceled = [g for g in goals if g.cancel_after_s is not None]
    assert abs(len(canceled) / n - 0.10) < 0.03
    assert all(0.0 <= g.cancel_after_s <= 2.0 for g in canceled)
    good = [g for g in goals if not g.kind.startswith('bad')]
    policies = collections.Counter(g.policy for g in good)
    assert set(policies) == set(soak.POLICIES)
    assert all(abs(policies[p] / len(good) - 0.25) < 0.04 for p in soak.POLICIES)
    assert policies[POLICY_DEFAULT] > 0


def test_budgets_are_log_uniform_from_impossible_to_generous(plan):
    budgets = [g.budget_s for g in plan[1] if not g.kind.startswith('bad')]
    assert min(budgets) >= 0.02 and max(budgets) <= 30.0
    logs = sorted(math.log(b) for b in budgets)
    middle = (math.log(0.02) + math.log(30.0)) / 2
    assert abs(sum(x < middle for x in logs) / len(logs) - 0.5) < 0.05
    assert min(budgets) < 0.05 and max(budgets) > 25.0


def test_every_bad_input_kind_occurs_and_is_bad(plan):
    bad = [g for g in plan[1] if g.kind.startswith('bad:')]
    assert {g.kind[4:] for g in bad} == set(soak.BAD_KINDS)
    for goal in bad:
        what = goal.kind[4:]
        if what == 'empty_prompt':
            assert not goal.prompt.strip()
        elif what == 'negative_budget':
            assert goal.budget_s < 0
        elif what == 'zero_budget':
            assert goal.budget_s == 0
        elif what == 'nan_temperature':
            assert math.isnan(goal.temperature)
        elif what == 'long_prompt':
            assert len(goal.prompt) == 70_000
        elif what == 'unknown_policy':
            assert goal.policy not in soak.POLICIES
        elif what == 'bad_schema':
            assert goal.json_schema


def test_follow_ups_share_four_long_contexts_and_the_bursts_come_every_minute(plan):
    contexts, goals = plan
    assert len(contexts) == 4
    assert all(1500 <= len(c) <= 3000 for c in contexts)
    follow = [g for g in goals if g.kind == 'followup']
    assert {g.context for g in follow} == {0, 1, 2, 3}
    assert all(g.prompt.startswith(contexts[g.context]) for g in follow)
    assert len({g.prompt for g in follow}) > 20  # the question varies
    at = collections.Counter(g.at_s for g in goals)
    bursts = [t for t, count in at.items() if count >= soak.BURST_GOALS]
    assert sorted(bursts) == [30.0 + 60.0 * k for k in range(30)]
    assert [g.at_s for g in goals] == sorted(g.at_s for g in goals)
    assert [g.index for g in goals] == list(range(len(goals)))


def test_chat_and_json_goals_carry_their_fields(plan):
    goals = plan[1]
    chats = [g for g in goals if g.kind == 'chat']
    assert chats and all(g.messages and g.messages[-1][0] == 'assistant' for g in chats)
    schemas = [g for g in goals if g.kind == 'json']
    assert schemas and all(g.json_schema in soak.JSON_SCHEMAS for g in schemas)


@pytest.mark.parametrize('duration, rate', [(0, 1.0), (-5, 1.0), (60, 0), (60, float('nan')),
                                            (60, -1.0)])
def test_make_plan_refuses_bad_arguments(duration, rate):
    with pytest.raises(ValueError, match='duration_s|rate'):
        soak.make_plan(0, duration, rate)


# --- the statistics, on synthetic records ---------------------------------------------------
def record(sent_s, budget_s=1.0, response_s=0.01, ended_s=None, status=None, **more):
    """Return a goal record as the soak keeps it (times in s from the load's start)."""
    rec = {'index': 0, 'kind': 'plain', 'sent_s': sent_s, 'budget_s': budget_s,
           'response_s': None if response_s is None else sent_s + response_s,
           'accepted': None if response_s is None else True,
           'ended_s': ended_s, 'status': status, 'error_code': 0,
           'status_name': None if status is None else STATUS_NAMES.get(status, str(status)),
           'goal_status': soak_report.GOAL_STATUS_OF.get(status, 6),
           'deadline_met': True, 'total_s': 0.5, 'queue_s': 0.1, 'predicted_wcet_s': 1.0}
    rec.update(more)
    return rec


def test_the_lost_goal_rule():
    grace = 60.0
    on_time = record(10.0, budget_s=5.0, ended_s=70.0, status=COMPLETED)
    late = record(10.0, budget_s=5.0, ended_s=76.0, status=COMPLETED)
    waiting = record(10.0, budget_s=5.0)
    assert soak_report.loss_state(on_time, 1000.0, grace) == 'ended'
    assert soak_report.loss_state(late, 1000.0, grace) == 'lost'
    assert soak_report.loss_state(waiting, 74.9, grace) == 'pending'
    assert soak_report.loss_state(waiting, 75.1, grace) == 'lost'
    no_response = record(10.0, budget_s=5.0, response_s=None)
    assert soak_report.loss_state(no_response, 74.0, grace) == 'pending'
    assert soak_report.loss_state(no_response, 80.0, grace) == 'unanswered'
    negative = record(10.0, budget_s=-3.0)
    assert soak_report.loss_state(negative, 69.0, grace) == 'pending'
    assert soak_report.loss_state(negative, 71.0, grace) == 'lost'
    refused = dict(record(10.0), accepted=False)
    assert soak_report.loss_state(refused, 1000.0, grace) == 'refused'


def test_percentile_interpolates_and_checks_q():
    assert soak_report.percentile([], 0.5) is None
    assert soak_report.percentile([3.0], 0.99) == 3.0
    assert soak_report.percentile(list(range(101)), 0.99) == pytest.approx(99.0)
    assert soak_report.percentile([1.0, 2.0], 0.5) == pytest.approx(1.5)
    with pytest.raises(ValueError, match='1.5'):
        soak_report.percentile([1.0], 1.5)


def test_growth_is_a_least_squares_fit_in_mb_per_hour():
    samples = [{'t_s': t, 'rss_mb': 1000.0 + 20.0 * t / 3600.0 + (5.0 if t % 10 else -5.0),
                'threads': 30, 'fds': 40} for t in range(0, 3600, 5)]
    assert soak_report.growth_mb_per_h(samples, 600.0, 3600.0) == pytest.approx(20.0, rel=0.05)
    assert soak_report.growth_mb_per_h(samples, 5000.0, 6000.0) is None
    flat = [dict(s, rss_mb=500.0) for s in samples]
    assert soak_report.growth_mb_per_h(flat, 0.0, 3600.0) == pytest.approx(0.0)


def test_compare_windows_use_ten_minutes_or_thirds():
    assert soak_report.compare_windows(3600.0) == ((0.0, 600.0), (3000.0, 3600.0), 600.0)
    assert soak_report.compare_windows(180.0) == ((0.0, 60.0), (120.0, 180.0), 60.0)
    with pytest.raises(ValueError, match='0'):
        soak_report.compare_windows(0.0)


def synthetic_run():
    """Return a 3-minute run: every status, one lost goal, one pending, INACTIVE refusals."""
    records = [
        record(1.0, ended_s=2.0, status=COMPLETED),                        # on time
        record(2.0, ended_s=4.0, status=COMPLETED, deadline_met=False,     # late
               total_s=2.0, queue_s=0.1, predicted_wcet_s=1.0),            # over its WCET
        record(5.0, ended_s=6.0, status=KILLED, deadline_met=False),
        record(20.0, ended_s=21.0, status=SKIPPED, deadline_met=False),
        record(30.0, ended_s=30.02, status=REJECTED, response_s=0.002),
        record(62.0, ended_s=62.03, status=REJECTED, error_code=ERROR_INACTIVE),
        record(64.0, ended_s=64.05, status=REJECTED, error_code=ERROR_INACTIVE),
        record(65.0, ended_s=66.0, status=CANCELED),
        record(70.0, budget_s=2.0),                                        # lost at 132 s
        record(121.0, ended_s=125.0, status=COMPLETED, response_s=0.2),
        record(150.0, budget_s=30.0, response_s=0.3),                      # pending at the end
        record(155.0, ended_s=182.0, status=0),                            # empty result
    ]
    samples = [{'t_s': float(t), 'rss_mb': 2000.0 + t, 'threads': 31 + t // 60,
                'fds': 40} for t in range(0, 185, 5)]
    return {'records': records, 'samples': samples, 'duration_s': 180.0, 'end_s': 185.0,
            'grace_s': 60.0, 'node_died_s': None, 'ready': True, 'node_exit_code': 0,
            'node_killed': False, 'node_stop_s': 1.2, 'command': 'timebill soak --minutes 3',
            'seed': 0, 'rate': 1.0, 'host': 'testhost', 'cpus': 2, 'date': '2026-01-01',
            'events': [{'t_s': 60.0, 'event': 'deactivate', 'ok': True, 'took_s': 0.01},
                       {'t_s': 120.0, 'event': 'predictor swap', 'copied': [],
                        'why': 'no predictor swap: no files'}],
            'swap_log': []}


def test_minute_rows_count_by_send_and_end_minute():
    rows = soak_report.minute_rows(synthetic_run())
    assert [r['minute'] for r in rows] == [0, 1, 2, 3]
    assert [r['after_load'] for r in rows] == [False, False, False, True]
    first, second, third, after = rows
    assert first['sent'] == 5 and first['COMPLETED'] == 2 and first['KILLED'] == 1
    assert first['SKIPPED'] == 1 and first['REJECTED'] == 1 and first['inactive'] == 0
    assert first['ran'] == 4 and first['miss_rate'] == pytest.approx(0.75)
    assert first['wcet_coverage'] == pytest.approx(0.5)  # run 1.9 s > WCET 1.0 s
    assert first['refusal_p50_ms'] == pytest.approx(20.0)
    assert second['sent'] == 4 and second['lost'] == 1 and second['inactive'] == 2
    assert second['REJECTED'] == 2 and second['CANCELED'] == 1
    assert third['sent'] == 3 and third['pending'] == 1 and third['lost'] == 0
    assert third['response_p99_ms'] == pytest.approx(299.0, rel=0.01)
    assert after['sent'] == 0 and after['other'] == 1
    assert first['rss_mb'] == 2055.0 and third['rss_mb'] == 2175.0
    assert after['threads'] == 34


def test_summary_totals_growth_and_failures():
    run = synthetic_run()
    summary = soak_report.summarize(run)
    assert summary['sent'] == 12 and summary['lost'] == 1 and summary['pending'] == 1
    assert summary['inactive_rejected'] == 2
    assert summary['by_status']['other'] == 1
    assert summary['growth_mb_per_h'] == pytest.approx(3600.0)  # 1 MB/s
    assert summary['rss_mb'] == (2000.0, 2180.0)
    assert summary['threads'] == (31, 34)
    assert summary['response_p99_ms'][0] == pytest.approx(10.0)
    assert summary['response_p99_ms'][1] == pytest.approx(299.0, rel=0.01)
    assert not summary['ok']
    assert any('1 lost' in text for text in summary['failures'])
    assert any('without a terminal status' in text for text in summary['failures'])


def test_a_dead_node_loses_every_goal_still_waiting():
    run = dict(synthetic_run(), node_died_s=150.0)
    summary = soak_report.summarize(run)
    assert summary['lost'] == 2 and summary['pending'] == 0
    assert any('died' in text for text in summary['failures'])


def test_a_clean_run_passes():
    run = synthetic_run()
    run['records'] = [r for r in run['records']
                      if r['status'] not in (None, 0)]
    summary = soak_report.summarize(run)
    assert summary['ok'] and summary['failures'] == []


def test_the_report_holds_the_table_and_the_summary(tmp_path):
    run = synthetic_run()
    summary = soak_report.write_outputs(run, str(tmp_path))
    text = (tmp_path / 'soak.md').read_text()
    assert soak_report.TABLE_HEAD in text
    assert '| 3+ | 0 |' in text and '| 1 | 4 |' in text
    for words in ('timebill soak --minutes 3', 'testhost', '2 CPUs', 'FAIL', 'lost goals: 1',
                  'MB/hour', 'deactivate at 60 s', 'no predictor swap'):
        assert words in text
    assert (tmp_path / 'soak.png').stat().st_size > 1000
    import json
    saved = json.loads((tmp_path / soak_report.RUN_FILE).read_text())['run']
    assert summary['lost'] == 1 and saved['command'] == 'timebill soak --minutes 3'
    assert 'records' not in saved and 'samples' not in saved
    import csv
    with open(tmp_path / 'soak_goals.csv', encoding='utf-8') as stream:
        goals = list(csv.DictReader(stream))
    assert len(goals) == len(run['records'])
    assert [int(row['index']) for row in goals] == [r['index'] for r in run['records']]
    assert {row['status_name'] for row in goals} == {
        r.get('status_name') or '' for r in run['records']}
    with open(tmp_path / 'soak_samples.csv', encoding='utf-8') as stream:
        samples = list(csv.DictReader(stream))
    assert [float(row['rss_mb']) for row in samples] == pytest.approx(
        [sample['rss_mb'] for sample in run['samples']], abs=1e-6)


def test_report_only_recomputes_the_report_from_the_kept_files(tmp_path):
    run = synthetic_run()
    run['records'][0]['sent_s'] = 1.0000004  # kept to 6 decimals: the same figures
    summary = soak_report.write_outputs(run, str(tmp_path))
    first = (tmp_path / 'soak.md').read_text()
    (tmp_path / 'soak.md').unlink()
    kept = {name: (tmp_path / name).read_bytes() for name in (
        soak_report.RUN_FILE, 'soak_goals.csv', 'soak_samples.csv')}
    read = soak_report.read_run(str(tmp_path))
    assert [r['status'] for r in read['records']] == [r['status'] for r in run['records']]
    assert read['records'][2]['accepted'] is True and read['records'][8]['ended_s'] is None
    assert read['samples'][1] == {'t_s': 5.0, 'rss_mb': 2005.0, 'threads': 31, 'fds': 40}
    assert soak.report_again(tmp_path) == 1  # the run lost a goal
    assert (tmp_path / 'soak.md').read_text() == first
    assert all((tmp_path / name).read_bytes() == data for name, data in kept.items())
    again = soak_report.summarize(read)
    assert again['failures'] == summary['failures'] and again['sent'] == summary['sent']
    assert again['response_p99_ms'] == pytest.approx(summary['response_p99_ms'])


def test_report_only_names_a_missing_file_and_a_bad_cell(tmp_path):
    soak_report.write_outputs(synthetic_run(), str(tmp_path))
    rows = (tmp_path / 'soak_samples.csv').read_text().splitlines()
    rows[2] = rows[2].replace(',40', ',forty')
    (tmp_path / 'soak_samples.csv').write_text('\n'.join(rows) + '\n')
    with pytest.raises(ValueError, match=r"soak_samples.csv:3: column 'fds' holds 'forty'"):
        soak_report.read_run(str(tmp_path))
    (tmp_path / soak_report.RUN_FILE).unlink()
    with pytest.raises(FileNotFoundError, match='soak_run.json'):
        soak.report_again(tmp_path)


def test_node_params_hold_the_soak_settings(tmp_path):
    from timebill_ros import params
    path, config = soak.write_node_params(tmp_path)
    loaded = params.load_config(str(path))
    assert loaded.scheduler.continuous and loaded.scheduler.batch_size == 4
    assert loaded.scheduler.policy == 'up' and loaded.offload.enabled
    assert loaded.prefix_cache.enabled and loaded.engine.model_path == ''
    assert loaded.predictor.model_file.startswith(str(tmp_path / 'predictors'))
    assert not os.path.exists(loaded.predictor.model_file)


def test_the_swap_brings_the_rlps_offload_sample_first(tmp_path):
    from timebill_ros import params
    _, config = soak.write_node_params(tmp_path)
    pairs = soak.predictor_paths(tmp_path, config)
    names = [target.name for _, target in pairs]
    assert names[0].endswith('__rlp.onnx.lengths.json') and names[1].endswith('__rlp.onnx')
    assert names[2].endswith('__readout.onnx')
    node = params.load_config(str(tmp_path / 'soak_params.yaml'))
    assert [str(target) for _, target in pairs[1:]] == [node.predictor.model_file,
                                                        node.predictor.readout_file]


def test_swap_copies_cached_files_into_place_or_says_why(tmp_path):
    source = tmp_path / 'cache' / 'm__rlp.onnx'
    missing = tmp_path / 'cache' / 'm__readout.onnx'
    target = tmp_path / 'out' / 'predictors'
    pairs = [(source, target / source.name), (missing, target / missing.name)]
    outcome = soak.swap_predictor(pairs)
    assert outcome['copied'] == [] and 'no predictor swap' in outcome['why']
    source.parent.mkdir()
    source.write_bytes(b'onnx')
    outcome = soak.swap_predictor(pairs)
    assert outcome['copied'] == [str(target / source.name)]
    assert (target / source.name).read_bytes() == b'onnx'
    assert not (target / missing.name).exists()


@pytest.mark.skipif(not os.environ.get('TIMEBILL_SOAK_MINUTES'),
                    reason='set TIMEBILL_SOAK_MINUTES to run the real soak')
def test_the_real_soak_loses_no_goal(tmp_path):
    minutes = os.environ['TIMEBILL_SOAK_MINUTES']
    done = subprocess.run([sys.executable, '-m', 'timebill_ros.cli', 'soak', '--minutes',
                           minutes, '--out', str(tmp_path)], check=False)
    assert (tmp_path / 'soak.md').is_file()
    assert done.returncode == 0, (tmp_path / 'soak.md').read_text()


def test_a_predictor_swap_is_a_level_step_fitted_on_each_side():
    """Flat at 1000 MB, +150 MB at the swap (40 min), flat after: no growth on either side."""
    samples = [{'t_s': t, 'rss_mb': 1000.0 + (150.0 if t >= 2400 else 0.0) + (t % 10) / 10,
                'threads': 40, 'fds': 23} for t in range(0, 3600, 5)]
    run = {'events': [{'event': 'predictor swap', 't_s': 2400.0, 'copied': ['rlp.onnx']}]}
    whole = soak_report.growth_mb_per_h(samples, 600.0, 3600.0)
    split = soak_report.swap_growth(run, samples, 600.0, 3600.0)
    assert whole > 100  # the step reads as growth over the whole run
    assert abs(split['before']) < 1 and abs(split['after']) < 1
    assert split['mean_after'] - split['mean_before'] == pytest.approx(150.0, abs=1)
    assert split['windows_s'] == ((600.0, pytest.approx(2400.0)), (2520.0, 3600.0))
    line = soak_report._swap_lines(split)[0]
    assert 'level step' in line and '40.0 min' in line
    no_files = {'events': [{'event': 'predictor swap', 't_s': 2400.0, 'copied': []}]}
    assert soak_report.swap_growth(no_files, samples, 600.0, 3600.0) is None
    assert soak_report.swap_growth({}, samples, 600.0, 3600.0) is None
