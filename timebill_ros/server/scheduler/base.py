"""Base class of scheduler policies: a priority key per queued goal, the smallest runs next."""

import abc


class SchedulerPolicy(abc.ABC):
    """Picks which queued goal an executor runs next.

    A policy overrides ``key``; ``select`` runs the goal with the smallest key, ties broken
    by receipt. The goals a policy sees carry (server/job.py): ``received_s`` and
    ``deadline_s`` (service-clock seconds), ``uncertainty_tokens`` (u_J: the predicted
    response length, tokens; the goal's N_max while no prediction is known) and
    ``estimated_time_s`` (t^_J: its execution time from the time model for u_J tokens,
    seconds). Priorities are recomputed at every choice (``now_s``), so a policy built on
    slack sees the slack left, not the slack at receipt.
    """

    name = 'base'
    # Whether key() reads u_J or t^_J (uncertainty_tokens, estimated_time_s): a waiting
    # goal's length is predicted at admission only when something reads it (service.py).
    uses_uncertainty = True

    @classmethod
    def from_config(cls, config):
        """Return the policy for a ServerConfig (make_scheduler_policy's one factory shape)."""
        return cls()

    @abc.abstractmethod
    def key(self, job, now_s):
        """Return a sortable priority key of ``job`` at ``now_s`` (seconds): smaller first."""

    def select(self, jobs, now_s):
        """Return the index in ``jobs`` (arrival order, non-empty) of the goal to run next."""
        return min(range(len(jobs)),
                   key=lambda i: (self.key(jobs[i], now_s), jobs[i].received_s, i))


def slack_s(job, now_s):
    """Return zeta_J = d_J - now - t^_J, seconds: the time the goal can still wait."""
    return job.deadline_s - now_s - job.estimated_time_s
