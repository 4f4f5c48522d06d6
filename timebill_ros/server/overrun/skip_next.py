"""Skip-Next: an overrunning goal runs to completion; goals that come due meanwhile are skipped.

The skipping itself is done by the job queue's reaper, which asks the running goal's policy
(:meth:`SkipNextPolicy.skips_queued`) and ends queued goals whose deadline passes with status
SKIPPED.
"""

from timebill_ros.server import status
from timebill_ros.server.overrun.base import OverrunPolicy
from timebill_ros.timing.goal_budget import BudgetRules
from timebill_ros.timing.online import LEAST


class SkipNextPolicy(OverrunPolicy):
    """Never stop a running goal for its deadline."""

    name = 'skip_next'
    code = status.POLICY_SKIP_NEXT

    def stop_criteria(self, deadline_s, clock):
        """No deadline criterion: the goal finishes late."""
        return []

    def skips_queued(self, own_deadline_s, now_s):
        """Skip queued goals that come due while this one runs past its deadline."""
        return own_deadline_s < now_s

    def budget_rules(self):
        """Clamp alpha*: a late answer makes the goals after it skip."""
        return BudgetRules(step_bound=LEAST, clamps_alpha=True)
