"""Sliding-window server statistics and the diagnostics level they imply."""

import collections
import dataclasses
import threading

from timebill_ros.server import status

OK, WARN, ERROR = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class StatsSnapshot:
    """Counts over the window of the last terminal goals that were due (not REJECTED/CANCELED).

    completion_rate: share COMPLETED on time. deadline_misses: KILLED, SKIPPED, FAILED or
    COMPLETED late. Times in seconds.
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


class ServerStats:
    """Thread-safe sliding window over terminal results."""

    def __init__(self, window):
        self._window = collections.deque(maxlen=window)
        self._by_status = collections.Counter()
        self._total = 0
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
            if result.status not in (status.REJECTED, status.CANCELED):
                on_time = result.status == status.COMPLETED and result.deadline_met
                self._window.append(on_time)

    def snapshot(self) -> StatsSnapshot:
        """Return the current counts."""
        with self._lock:
            n = len(self._window)
            on_time = sum(self._window)
            return StatsSnapshot(
                window_size=n, completion_rate=on_time / n if n else 1.0,
                deadline_misses=n - on_time, miss_rate=(n - on_time) / n if n else 0.0,
                total_goals=self._total, by_status=dict(self._by_status),
                last_kill_latency_s=self._last_kill_latency_s,
                last_total_time_s=self._last_total_s, last_predicted_wcet_s=self._last_wcet_s)


def diagnostic_level(snapshot, stats_config):
    """Return (level, message) for /diagnostics from the window's miss rate."""
    rate = snapshot.miss_rate
    text = f'{snapshot.deadline_misses} of last {snapshot.window_size} goals missed the deadline'
    if snapshot.window_size and rate >= stats_config.miss_rate_error:
        return ERROR, 'deadline miss rate high: ' + text
    if snapshot.window_size and rate >= stats_config.miss_rate_warn:
        return WARN, 'deadline miss rate elevated: ' + text
    return OK, text
