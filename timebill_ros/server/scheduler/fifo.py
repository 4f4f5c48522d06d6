"""First in, first out."""

from timebill_ros.server.scheduler.base import SchedulerPolicy


class FifoPolicy(SchedulerPolicy):
    """Run goals in order of receipt (``received_s``), not of reaching the queue."""

    name = 'fifo'
    uses_uncertainty = False

    def key(self, job, now_s):
        """Return the receipt time, seconds."""
        return job.received_s
