"""Skip-Next: an overrunning goal runs to completion; goals that come due meanwhile are skipped.

The skipping itself is done by the job queue, which ends queued goals whose deadline passes
while the running goal overruns under this policy with status SKIPPED.
"""

from timebill_ros.server import status
from timebill_ros.server.overrun.base import OverrunPolicy


class SkipNextPolicy(OverrunPolicy):
    """Never stop a running goal for its deadline."""

    name = 'skip_next'
    code = status.POLICY_SKIP_NEXT
    skips_due_goals = True
    discards_late_result = False
    clamps_alpha = True

    def stop_criteria(self, deadline_s, clock):
        """No deadline criterion: the goal finishes late."""
        return []
