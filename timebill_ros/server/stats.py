"""Sliding-window server statistics, (m,k)-firm deadlines, and the diagnostics level.

A goal is *due* unless it was REJECTED for bad input or CANCELED by its client: infeasible
rejections count as misses (the planner got no answer in time). It *met* its deadline when it
ended COMPLETED on time (a Partial goal truncated at its deadline meets it).
"""

import collections
import dataclasses
import threading

from timebill_ros.server import status

OK, WARN, ERROR = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class StatsSnapshot:
    """Counts over the last due goals; times in seconds.

    window_size / completion_rate / deadline_misses / miss_rate: over the last ``window``
    due goals. misses_total: since start. consecutive_misses: due goals missed in a row,
    up to now. firm_met / firm_window: met among the last ``firm_k`` due goals, and how many
    those are. kill_latency_max_s: largest stop time - deadline of the KILLED goals in the
    window (negative when all were stopped early). wcet_coverage: share of the goals that
    ran to the end (not killed, not truncated) whose execution time was within their
    t^_WCET, over ``wcet_samples`` such goals (1.0 when none).
    """

    window_size: int
    completion_rate: float
    deadline_misses: int
    miss_rate: float
    total_goals: int
    by_status: dict
    last_kill_latency_s: float
    last_total_time_s: float
    last_predicted_wcet_s: float
    misses_total: int
    consecutive_misses: int
    firm_met: int
    firm_window: int
    kill_latency_max_s: float
    wcet_coverage: float
    wcet_samples: int


def is_due(result) -> bool:
    """Return True when ``result`` counts for deadline statistics (see the module doc)."""
    if result.status == status.CANCELED:
        return False
    return result.status != status.REJECTED or result.infeasible


class ServerStats:
    """Thread-safe sliding windows over terminal results."""

    def __init__(self, window, firm_k=10):
        self._window = collections.deque(maxlen=window)
        self._firm = collections.deque(maxlen=firm_k)
        self._kill_latencies = collections.deque(maxlen=window)
        self._wcet_within = collections.deque(maxlen=window)
        self._by_status = collections.Counter()
        self._total = 0
        self._misses_total = 0
        self._consecutive = 0
        self._last_kill_latency_s = 0.0
        self._last_total_s = 0.0
        self._last_wcet_s = 0.0
        self._lock = threading.Lock()

    def record(self, result):
        """Add one terminal JobResult."""
        with self._lock:
            self._total += 1
            self._by_status[result.status_name] += 1
            self._last_total_s = result.total_time_s
            self._last_wcet_s = result.predicted_wcet_s
            if result.status == status.KILLED and result.kill_latency_s is not None:
                self._last_kill_latency_s = result.kill_latency_s
                self._kill_latencies.append(result.kill_latency_s)
            if (result.status == status.COMPLETED and not result.truncated
                    and result.predicted_wcet_s > 0):
                self._wcet_within.append(result.execution_time_s <= result.predicted_wcet_s)
            if is_due(result):
                met = result.status == status.COMPLETED and result.deadline_met
                self._window.append(met)
                self._firm.append(met)
                self._misses_total += not met
                self._consecutive = 0 if met else self._consecutive + 1

    def snapshot(self) -> StatsSnapshot:
        """Return the current counts."""
        with self._lock:
            n = len(self._window)
            on_time = sum(self._window)
            covered = len(self._wcet_within)
            return StatsSnapshot(
                window_size=n, completion_rate=on_time / n if n else 1.0,
                deadline_misses=n - on_time, miss_rate=(n - on_time) / n if n else 0.0,
                total_goals=self._total, by_status=dict(self._by_status),
                last_kill_latency_s=self._last_kill_latency_s,
                last_total_time_s=self._last_total_s, last_predicted_wcet_s=self._last_wcet_s,
                misses_total=self._misses_total, consecutive_misses=self._consecutive,
                firm_met=sum(self._firm), firm_window=len(self._firm),
                kill_latency_max_s=max(self._kill_latencies, default=0.0),
                wcet_coverage=sum(self._wcet_within) / covered if covered else 1.0,
                wcet_samples=covered)


def firm_ok(snapshot, stats_config) -> bool:
    """Return True while at most k - m of the last k due goals missed ((m,k)-firm).

    Before k goals were seen the missing ones count as met: the constraint can only be
    broken by the misses already seen.
    """
    misses = snapshot.firm_window - snapshot.firm_met
    return misses <= stats_config.firm_k - stats_config.firm_m


def diagnostic_level(snapshot, stats_config):
    """Return (level, message) for /diagnostics: the window's miss rate, then (m,k)-firm."""
    rate = snapshot.miss_rate
    text = f'{snapshot.deadline_misses} of last {snapshot.window_size} goals missed the deadline'
    if snapshot.window_size and rate >= stats_config.miss_rate_error:
        return ERROR, 'deadline miss rate high: ' + text
    if snapshot.window_size and rate >= stats_config.miss_rate_warn:
        return WARN, 'deadline miss rate elevated: ' + text
    if not firm_ok(snapshot, stats_config):
        return WARN, (f'(m,k)-firm deadlines broken: {snapshot.firm_met} of the last '
                      f'{snapshot.firm_window} goals met their deadline, need '
                      f'{stats_config.firm_m} of {stats_config.firm_k}')
    return OK, text
