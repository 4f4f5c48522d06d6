"""Server statistics (server/stats.py): due goals, misses, (m,k)-firm, diagnostics levels."""

import pytest

from timebill_ros.config import StatsConfig
from timebill_ros.server import status
from timebill_ros.server.goals import JobResult
from timebill_ros.server.stats import (diagnostic_level, ERROR, firm_ok, is_due, OK,
                                       ServerStats, WARN)

FIRM = StatsConfig(firm_m=3, firm_k=4, miss_rate_warn=0.9, miss_rate_error=1.0)


def met():
    """Return a goal COMPLETED on time."""
    return JobResult(status.COMPLETED, 'ok', deadline_met=True)


def late():
    """Return a goal COMPLETED after its deadline (Skip-Next)."""
    return JobResult(status.COMPLETED, 'late', deadline_met=False)


def killed(latency_s=None):
    """Return a KILLED goal, stopped ``latency_s`` after its deadline."""
    return JobResult(status.KILLED, 'killed', kill_latency_s=latency_s)


def bad_input():
    """Return a goal REJECTED by validation (not due)."""
    return JobResult(status.REJECTED, 'prompt is empty')


def infeasible():
    """Return a goal that admission REJECTED as unable to fit (due: a miss)."""
    return JobResult(status.REJECTED, 'infeasible', infeasible=True)


def canceled():
    """Return a goal CANCELED by its client (not due)."""
    return JobResult(status.CANCELED, 'canceled')


def record_all(stats, results):
    """Record ``results`` in order and return the snapshot."""
    for result in results:
        stats.record(result)
    return stats.snapshot()


def test_is_due():
    assert is_due(met()) and is_due(late()) and is_due(killed(0.1))
    assert is_due(JobResult(status.SKIPPED, 'skipped'))
    assert is_due(JobResult(status.FAILED, 'failed'))
    assert not is_due(bad_input())
    assert not is_due(canceled())
    assert not is_due(JobResult(status.CANCELED, 'canceled', infeasible=True))
    assert is_due(infeasible())


def test_empty_snapshot():
    snap = ServerStats(10, firm_k=4).snapshot()
    assert (snap.window_size, snap.completion_rate, snap.deadline_misses, snap.miss_rate) == (
        0, 1.0, 0, 0.0)
    assert (snap.total_goals, snap.misses_total, snap.consecutive_misses) == (0, 0, 0)
    assert (snap.firm_met, snap.firm_window) == (0, 0)
    assert snap.kill_latency_max_s == 0.0
    assert (snap.wcet_coverage, snap.wcet_samples) == (1.0, 0)
    assert diagnostic_level(snap, FIRM) == (OK, '0 of last 0 goals missed the deadline')


def test_misses_consecutive_and_completion_rate():
    stats = ServerStats(10, firm_k=4)
    snap = record_all(stats, [late(), killed(0.2), infeasible()])
    assert (snap.misses_total, snap.consecutive_misses) == (3, 3)
    # Goals that are not due neither count nor break the run of misses.
    snap = record_all(stats, [bad_input(), canceled()])
    assert (snap.misses_total, snap.consecutive_misses, snap.window_size) == (3, 3, 3)
    assert snap.total_goals == 5
    snap = record_all(stats, [met()])
    assert (snap.misses_total, snap.consecutive_misses) == (3, 0)
    snap = record_all(stats, [JobResult(status.SKIPPED, 'skipped'), met(), met(), met()])
    assert (snap.misses_total, snap.consecutive_misses) == (4, 0)
    assert snap.window_size == 8 and snap.deadline_misses == 4
    assert snap.completion_rate == 0.5 and snap.miss_rate == 0.5
    assert snap.by_status == {'COMPLETED': 5, 'KILLED': 1, 'REJECTED': 2, 'CANCELED': 1,
                              'SKIPPED': 1}


def test_window_slides_but_misses_total_does_not():
    stats = ServerStats(4, firm_k=4)
    snap = record_all(stats, [late(), late(), met(), met(), met(), met()])
    assert (snap.window_size, snap.deadline_misses, snap.completion_rate) == (4, 0, 1.0)
    assert snap.misses_total == 2 and snap.total_goals == 6
    snap = record_all(stats, [late()])
    assert snap.completion_rate == 0.75 and snap.miss_rate == 0.25


def test_firm_ok_and_warn_with_the_window_sliding():
    stats = ServerStats(50, firm_k=4)
    snap = record_all(stats, [met()] * 10 + [late()])
    assert (snap.firm_met, snap.firm_window) == (3, 4)
    assert firm_ok(snap, FIRM)
    assert diagnostic_level(snap, FIRM) == (OK, '1 of last 11 goals missed the deadline')
    snap = record_all(stats, [killed(0.1)])  # 2 misses in the last 4
    assert (snap.firm_met, snap.firm_window) == (2, 4)
    assert not firm_ok(snap, FIRM)
    assert diagnostic_level(snap, FIRM) == (
        WARN, '(m,k)-firm deadlines broken: 2 of the last 4 goals met their deadline, '
        'need 3 of 4')
    snap = record_all(stats, [met(), met()])  # last 4: miss miss met met
    assert diagnostic_level(snap, FIRM)[0] == WARN
    snap = record_all(stats, [met()])  # the first miss drops out: miss met met met
    assert (snap.firm_met, snap.firm_window) == (3, 4)
    assert firm_ok(snap, FIRM)
    assert diagnostic_level(snap, FIRM) == (OK, '2 of last 15 goals missed the deadline')


def test_firm_before_k_goals():
    stats = ServerStats(50, firm_k=4)
    snap = record_all(stats, [met(), late()])
    assert (snap.firm_met, snap.firm_window) == (1, 2) and firm_ok(snap, FIRM)
    snap = record_all(stats, [late()])
    assert not firm_ok(snap, FIRM)


def test_miss_rate_levels_take_precedence():
    snap = record_all(ServerStats(50, firm_k=4), [late()] * 4)
    assert not firm_ok(snap, FIRM)
    assert diagnostic_level(snap, FIRM) == (
        ERROR, 'deadline miss rate high: 4 of last 4 goals missed the deadline')
    snap = record_all(ServerStats(50, firm_k=4), [met()] + [late()] * 9)
    assert snap.miss_rate == 0.9
    assert diagnostic_level(snap, FIRM) == (
        WARN, 'deadline miss rate elevated: 9 of last 10 goals missed the deadline')


def test_kill_latency_max():
    stats = ServerStats(10, firm_k=4)
    snap = record_all(stats, [met(), killed(None), late()])
    assert snap.kill_latency_max_s == 0.0
    snap = record_all(stats, [killed(-0.5), killed(-0.25)])  # both stopped early
    assert snap.kill_latency_max_s == -0.25
    assert snap.last_kill_latency_s == -0.25
    # Only KILLED results count, whatever latency another status carries.
    snap = record_all(stats, [JobResult(status.COMPLETED, 'ok', kill_latency_s=9.0)])
    assert snap.kill_latency_max_s == -0.25
    snap = record_all(stats, [killed(0.125), killed(-1.0)])
    assert snap.kill_latency_max_s == 0.125 and snap.last_kill_latency_s == -1.0


def test_wcet_coverage():
    stats = ServerStats(10, firm_k=4)
    snap = record_all(stats, [
        JobResult(status.KILLED, 'k', predicted_wcet_s=1.0, execution_time_s=2.0),
        JobResult(status.COMPLETED, 'p', truncated=True, predicted_wcet_s=1.0,
                  execution_time_s=2.0, deadline_met=True),
        JobResult(status.COMPLETED, 'no wcet', predicted_wcet_s=0.0, execution_time_s=2.0),
    ])
    assert (snap.wcet_coverage, snap.wcet_samples) == (1.0, 0)
    snap = record_all(stats, [
        JobResult(status.COMPLETED, 'within', predicted_wcet_s=1.0, execution_time_s=0.5),
        JobResult(status.COMPLETED, 'equal', predicted_wcet_s=1.0, execution_time_s=1.0),
        JobResult(status.COMPLETED, 'over', predicted_wcet_s=1.0, execution_time_s=1.5),
        JobResult(status.COMPLETED, 'late within', predicted_wcet_s=3.0,
                  execution_time_s=2.0, deadline_met=False),
    ])
    assert snap.wcet_samples == 4
    assert snap.wcet_coverage == 0.75


@pytest.mark.parametrize('kwargs, match', [
    ({'firm_m': 5, 'firm_k': 4}, r'stats\.firm_m \(5\) must be <= stats\.firm_k \(4\)'),
    ({'firm_m': 0}, r'stats\.firm_m must be an int >= 1'),
    ({'firm_k': 0, 'firm_m': 1}, r'stats\.firm_k must be an int >= 1'),
])
def test_stats_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StatsConfig(**kwargs)


def test_stats_config_edges():
    config = StatsConfig(firm_m=4, firm_k=4)
    assert (config.firm_m, config.firm_k) == (4, 4)
