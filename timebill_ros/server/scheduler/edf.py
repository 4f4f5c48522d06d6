"""Earliest deadline first: RT-LM's HPF with the goal's deadline as its priority point."""

from timebill_ros.server.scheduler.base import SchedulerPolicy


class EdfPolicy(SchedulerPolicy):
    """Run the goal whose deadline comes first (RT-LM Sec. IV-B: d_J = the user's deadline).

    Uncertainty-oblivious: a long answer due soon runs before short ones due a little later.
    """

    name = 'edf'
    uses_uncertainty = False

    def key(self, job, now_s):
        """Return the deadline, service-clock seconds."""
        return job.deadline_s
