"""Kill: the goal stops at its deadline and its response is discarded (status KILLED)."""

from timebill_ros.server.overrun.base import OverrunPolicy
from timebill_ros.stopping import DeadlineStop


class KillPolicy(OverrunPolicy):
    """Stop generation at the deadline."""

    name = 'kill'
    discards_late_result = True

    def stop_criteria(self, deadline_s, clock):
        """Stop once the clock reaches the deadline."""
        return [DeadlineStop(deadline_s, clock)]
