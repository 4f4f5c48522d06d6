"""First in, first out."""

from timebill_ros.scheduler.base import SchedulerPolicy


class FifoPolicy(SchedulerPolicy):
    """Run goals in arrival order."""

    name = 'fifo'

    def select(self, jobs, now_s):
        """Return the oldest goal."""
        return 0
