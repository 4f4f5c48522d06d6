"""Base class of overrun policies."""

import abc

from timebill_ros.server import status


class OverrunPolicy(abc.ABC):
    """Decides how a running goal treats its deadline.

    ``discards_late_result``: a goal that finishes after its deadline ends KILLED (True) or
    COMPLETED with ``deadline_met`` false (False).
    ``stops_early``: the goal is stopped as soon as the time model says it can no longer
    finish (prefill left + one step > time left; next step > time left), and admission
    refuses it when it cannot fit at all.
    ``keeps_text_at_deadline``: a goal stopped at (or just before) its deadline while
    decoding returns the text so far as COMPLETED, ``truncated`` (the anytime answer).
    ``skips_due_goals``: while this goal runs past its deadline, queued goals whose own
    deadline passes end SKIPPED (the job queue does it).
    ``code``: the goal's ``overrun_policy`` constant of ``action/Instruct.action``
    (server/status.py mirrors them).
    ``clamps_alpha``: when no eviction ratio fits the time left, alpha* is clamped to
    alpha_max (the paper's Eq. 10c: the goal's best chance to finish), because lateness costs
    more than eviction: a late Kill answer is lost, a late Skip-Next answer makes the goals
    after it skip. False: the budget's quality rules apply (``budget.expected_fallback``,
    ``budget.keep_cache_when_hopeless``), for goals whose answer still arrives whole or cut.
    """

    name = 'base'
    code = status.POLICY_DEFAULT
    discards_late_result = False
    stops_early = False
    keeps_text_at_deadline = False
    skips_due_goals = False
    clamps_alpha = False

    @abc.abstractmethod
    def stop_criteria(self, deadline_s, clock):
        """Return the StopCriterion list that interrupts a goal for its deadline.

        deadline_s: absolute deadline in the clock's seconds. clock: monotonic seconds.
        These are checked before every decoder layer, chunk and step.
        """
