"""Least / most uncertainty first: RT-LM's LUF and MUF baselines (Sec. V)."""

from timebill_ros.server.scheduler.base import SchedulerPolicy


class LeastUncertaintyFirst(SchedulerPolicy):
    """Run the goal with the smallest u_J (predicted response tokens) first; deadline-blind."""

    name = 'luf'

    def key(self, job, now_s):
        """Return u_J, tokens."""
        return job.uncertainty_tokens


class MostUncertaintyFirst(SchedulerPolicy):
    """Run the goal with the largest u_J first (the paper's counter-example to LUF)."""

    name = 'muf'

    def key(self, job, now_s):
        """Return -u_J, tokens."""
        return -job.uncertainty_tokens
