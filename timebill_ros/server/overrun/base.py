"""Base class of overrun policies."""

import abc


class OverrunPolicy(abc.ABC):
    """Decides how a running goal treats its deadline.

    ``discards_late_result``: a goal that finishes after its deadline ends KILLED (True) or
    COMPLETED with ``deadline_met`` false (False).
    ``stops_early``: the goal is stopped as soon as the time model says it can no longer
    finish (prefill left + one step > time left; next step > time left), and admission
    refuses it when it cannot fit at all.
    ``keeps_text_at_deadline``: a goal stopped at (or just before) its deadline while
    decoding returns the text so far as COMPLETED, ``truncated`` (the anytime answer).
    """

    name = 'base'
    discards_late_result = False
    stops_early = False
    keeps_text_at_deadline = False

    @abc.abstractmethod
    def stop_criteria(self, deadline_s, clock):
        """Return the StopCriterion list that interrupts a goal for its deadline.

        deadline_s: absolute deadline in the clock's seconds. clock: monotonic seconds.
        These are checked before every decoder layer, chunk and step.
        """
