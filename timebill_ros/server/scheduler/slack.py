"""Least slack first: RT-LM's Eq. 2, p_J = 1 / zeta_J with zeta_J = d_J - now - t^_J."""

from timebill_ros.server.scheduler.base import SchedulerPolicy, slack_s


class SlackPolicy(SchedulerPolicy):
    """Run the goal with the least positive slack first (largest p_J = 1 / zeta_J).

    t^_J is the goal's execution time from the time model for u_J tokens (the paper's
    eta_f u_J, with the prefill of its prompt added). A goal whose slack is <= 0 is
    predicted to miss: Eq. 2 gives it a negative priority, i.e. it runs after every goal
    that can still make its deadline (among such goals: earliest deadline first). Under
    Kill it cannot starve: it ends when admission or the queue reaper finds it can no
    longer fit, at the latest at its deadline.
    """

    name = 'slack'

    def key(self, job, now_s):
        """Return (0, zeta_J) for a goal that can still fit, else (1, d_J)."""
        zeta = slack_s(job, now_s)
        return (0, zeta) if zeta > 0 else (1, job.deadline_s)
