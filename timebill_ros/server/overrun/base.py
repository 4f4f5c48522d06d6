"""Base class of overrun policies."""

import abc


class OverrunPolicy(abc.ABC):
    """Decides how a running goal treats its deadline.

    ``discards_late_result``: a goal that finishes after its deadline ends KILLED (True) or
    COMPLETED with ``deadline_met`` false (False).
    """

    name = 'base'
    discards_late_result = False

    @abc.abstractmethod
    def stop_criteria(self, deadline_s, clock):
        """Return the StopCriterion list that enforces this policy for a goal.

        deadline_s: absolute deadline in the clock's seconds. clock: monotonic seconds.
        """
