"""First in, first out."""

from timebill_ros.server.scheduler.base import SchedulerPolicy


class FifoPolicy(SchedulerPolicy):
    """Run goals in order of receipt (``received_s``), not of reaching the queue."""

    name = 'fifo'

    def select(self, jobs, now_s):
        """Return the goal received first (ties: the one queued first)."""
        return min(range(len(jobs)), key=lambda i: jobs[i].received_s)
