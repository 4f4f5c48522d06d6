"""Accept every valid goal (``admission.policy: none``): no feasibility check."""

from timebill_ros.server.admission.base import AdmissionPolicy, Verdict


class AcceptAllPolicy(AdmissionPolicy):
    """Admit every goal; its least time is still reported when a time model is given."""

    name = 'none'

    def __init__(self, time_model=None):
        """Use ``time_model`` (optional) only to report the least time."""
        self.time_model = time_model

    def check(self, job, now_s, queued=False):
        """Return an admitting Verdict."""
        least = self.time_model.least_e2e_s(job.n_x, job.n_cached) if self.time_model else 0.0
        return Verdict(admit=True, min_time_s=least)
