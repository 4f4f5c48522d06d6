"""Kill: the goal stops at its deadline, or earlier once it cannot finish; response discarded."""

from timebill_ros.server import status
from timebill_ros.server.overrun.base import OverrunPolicy
from timebill_ros.engine.stopping import DeadlineStop


class KillPolicy(OverrunPolicy):
    """Stop generation at the deadline (status KILLED)."""

    name = 'kill'
    code = status.POLICY_KILL
    discards_late_result = True
    clamps_alpha = True
    stops_early = True

    def stop_criteria(self, deadline_s, clock):
        """Stop once the clock reaches the deadline."""
        return [DeadlineStop(deadline_s, clock)]
