"""Feasibility: refuse a goal whose least possible time exceeds the time it has left.

The least time is the time model's LEAST bound (timing/online.py) of the prefill of N_x
tokens, the predictor time not hidden behind it, and one decoding step: nothing shorter can
produce an answer. Under Kill and Partial a goal that cannot fit is not admitted (REJECTED
with both numbers); under Skip-Next it runs, late by design, and its result says it was
infeasible.
"""

from timebill_ros.server.admission.base import AdmissionPolicy, Verdict


class FeasibilityPolicy(AdmissionPolicy):
    """Admit a goal only when its least time fits before its deadline."""

    name = 'feasibility'

    def __init__(self, time_model):
        """Use ``time_model`` (a timing.online.TimeModel) for the least times."""
        self.time_model = time_model

    def check(self, job, now_s, queued=False):
        """Compare the least time with the time left at ``now_s``; see the module doc."""
        min_time_s = self.time_model.least_e2e_s(job.n_x, job.n_cached)
        left_s = job.deadline_s - now_s
        if min_time_s <= left_s:
            return Verdict(admit=True, min_time_s=min_time_s)
        if queued:
            message = (f'infeasible after {now_s - job.received_s:.2f} s queued: needs at least '
                       f'{min_time_s:.2f} s, {max(left_s, 0.0):.2f} s left of the '
                       f'{job.budget_s:.2f} s budget')
        else:
            message = (f'infeasible: needs at least {min_time_s:.2f} s, budget '
                       f'{job.budget_s:.2f} s')
        return Verdict(admit=job.policy.admits_infeasible(), infeasible=True,
                       min_time_s=min_time_s, message=message)
