"""soak_report's WCET coverage, with and without the queue wait, and soak.md's recompute line.

Plain values only (no node, no load plan): the fast companion of test_soak.py.
"""

import pytest

from timebill_ros.bench import soak_report
from timebill_ros.server.status import COMPLETED, KILLED


def goal(sent_s, total_s, queue_s, wcet_s, status=COMPLETED):
    """Return a finished goal record as the soak keeps it."""
    return {'index': 0, 'kind': 'plain', 'sent_s': sent_s, 'budget_s': 10.0,
            'response_s': sent_s + 0.01, 'accepted': True, 'ended_s': sent_s + total_s,
            'status': status, 'error_code': 0, 'goal_status': 4, 'deadline_met': True,
            'total_s': total_s, 'queue_s': queue_s, 'predicted_wcet_s': wcet_s}


def test_coverage_takes_the_queue_off_unless_asked_to_keep_it():
    waited = goal(0.0, total_s=1.5, queue_s=0.7, wcet_s=1.0)  # run 0.8 s, total 1.5 s
    assert soak_report.wcet_covered(waited) is True
    assert soak_report.wcet_covered(waited, with_queue=True) is False
    assert soak_report.wcet_covered(goal(0.0, 1.5, 0.0, 0.0)) is None  # no t^_WCET made


def test_a_window_reports_both_coverages_over_completed_goals():
    records = [goal(1.0, 0.5, 0.0, 1.0),                  # covered either way
               goal(2.0, 1.5, 0.7, 1.0),                  # covered without the queue only
               goal(3.0, 2.0, 0.1, 1.0),                  # over either way
               goal(4.0, 3.0, 0.0, 1.0, status=KILLED)]   # not completed: not counted
    row = soak_report.window_stats(records, 0.0, 60.0, 1000.0, 60.0)
    assert row['wcet_coverage'] == pytest.approx(2 / 3)
    assert row['wcet_coverage_with_queue'] == pytest.approx(1 / 3)


def test_the_report_names_both_coverages_and_its_recompute_command(tmp_path):
    records = [goal(1.0, 0.5, 0.0, 1.0), goal(2.0, 1.5, 0.7, 1.0)]
    run = {'records': records, 'samples': [{'t_s': 0.0, 'rss_mb': 100.0, 'threads': 3,
                                            'fds': 4}],
           'duration_s': 60.0, 'end_s': 61.0, 'grace_s': 60.0, 'node_died_s': None,
           'command': 'timebill soak --minutes 1', 'seed': 0, 'rate': 1.0, 'host': 'h',
           'cpus': 2, 'date': 'd'}
    summary = soak_report.summarize(run)
    assert summary['wcet_coverage'] == 1.0 and summary['wcet_coverage_with_queue'] == 0.5
    text = soak_report.render_markdown(run, soak_report.minute_rows(run), summary,
                                       str(tmp_path))
    assert f'`timebill soak --report-only --out {tmp_path}`' in text
    assert 'WCET coverage of completed goals: 1.000 (run = total - queue' in text
    assert '0.500 with the queue wait included' in text
    assert soak_report.TABLE_HEAD.endswith('| WCET coverage | WCET coverage, queue included |')
    assert '| 1.00 | 0.50 |' in text
