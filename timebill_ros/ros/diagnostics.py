"""The node's periodic messages: ServerStats on ``stats_topic`` and its /diagnostics status.

Pure conversions from the service's stats snapshot (server/stats.py) and serving status to
ROS messages; the node's timer publishes them.
"""

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from std_msgs.msg import Header

from timebill_ros.msg import ServerStats
from timebill_ros.server.stats import firm_ok

LEVELS = (DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR)
MIB = float(2 ** 20)


def stats_msg(stamp, snap, serving, stats_config) -> ServerStats:
    """Return the ServerStats of one period.

    snap: server.stats snapshot; serving: the service's status(); stats_config: ``stats``.
    """
    return ServerStats(
        stamp=stamp, queue_depth=serving.queue_depth, busy=serving.busy,
        window_size=snap.window_size, completion_rate=float(snap.completion_rate),
        deadline_misses=snap.deadline_misses, miss_rate=float(snap.miss_rate),
        total_goals=snap.total_goals, last_kill_latency_s=snap.last_kill_latency_s,
        last_total_time_s=snap.last_total_time_s,
        last_predicted_wcet_s=snap.last_predicted_wcet_s,
        active_goals=serving.active_goals, misses_total=snap.misses_total,
        consecutive_misses=snap.consecutive_misses, firm_met=snap.firm_met,
        firm_window=snap.firm_window, firm_ok=firm_ok(snap, stats_config),
        kill_latency_max_s=float(snap.kill_latency_max_s),
        wcet_coverage=float(snap.wcet_coverage), wcet_samples=snap.wcet_samples,
        speed_factor_decode=float(serving.speed_factor_decode),
        speed_factor_prefill=float(serving.speed_factor_prefill),
        wcet_margin_decode=float(serving.wcet_margin_decode),
        wcet_margin_prefill=float(serving.wcet_margin_prefill),
        scheduler_policy=serving.scheduler_policy,
        executor_names=[name for name, _, _ in serving.executors],
        executor_busy=[busy for _, busy, _ in serving.executors],
        executor_queue_depth=[queued for _, _, queued in serving.executors],
        prefix_lookups=serving.prefix.lookups, prefix_hits=serving.prefix.hits,
        prefix_hit_rate=float(serving.prefix.hit_rate),
        prefix_store_mb=serving.prefix.bytes / MIB,
        prefix_store_max_mb=serving.prefix.max_bytes / MIB)


def diagnostic_values(snap, serving, stats_config):
    """Return the /diagnostics key/values (strings or numbers) for one period."""
    values = {
        'active_goals': serving.active_goals, 'queue_depth': serving.queue_depth,
        'busy': serving.busy, 'window_size': snap.window_size,
        'completion_rate': f'{snap.completion_rate:.3f}',
        'deadline_misses': snap.deadline_misses, 'misses_total': snap.misses_total,
        'consecutive_misses': snap.consecutive_misses,
        'firm_m_of_k': f'{stats_config.firm_m}/{stats_config.firm_k}',
        'firm_met': f'{snap.firm_met}/{snap.firm_window}',
        'total_goals': snap.total_goals,
        'last_kill_latency_s': f'{snap.last_kill_latency_s:.4f}',
        'kill_latency_max_ms': f'{snap.kill_latency_max_s * 1e3:.1f}',
        'wcet_coverage': f'{snap.wcet_coverage:.3f}', 'wcet_samples': snap.wcet_samples,
        'speed_factor': f'{serving.speed_factor_decode:.3f}',
        'speed_factor_prefill': f'{serving.speed_factor_prefill:.3f}',
        'wcet_margin': f'{serving.wcet_margin_decode:.3f}',
        'wcet_margin_prefill': f'{serving.wcet_margin_prefill:.3f}',
    }
    values['scheduler_policy'] = serving.scheduler_policy
    values.update({
        'prefix_hit_rate': f'{serving.prefix.hit_rate:.3f}',
        'prefix_hits': f'{serving.prefix.hits}/{serving.prefix.lookups}',
        'prefix_store_mb':
            f'{serving.prefix.bytes / MIB:.1f}/{serving.prefix.max_bytes / MIB:.0f}',
    })
    for name, busy, queued in serving.executors:
        values[f'executor_{name}'] = 'busy' if busy else 'idle'
        values[f'queue_depth_{name}'] = queued
    values.update({f'count_{name.lower()}': n for name, n in snap.by_status.items()})
    return values


def diagnostic_array(stamp, level, name, message, hardware_id, values) -> DiagnosticArray:
    """Return the /diagnostics message of one status.

    level: an index into LEVELS (0 OK, 1 WARN, 2 ERROR); values: {key: value}, as strings.
    """
    return DiagnosticArray(header=Header(stamp=stamp), status=[
        DiagnosticStatus(level=LEVELS[level], name=name, message=message,
                         hardware_id=hardware_id,
                         values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])])
