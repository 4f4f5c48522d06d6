"""Base class of overrun policies: every decision a deadline forces is a method here.

The goal pipeline, the admission check, the queue's reaper and the outcome ask the goal's
policy; none reads what kind of policy it is. A policy whose behaviour these methods cannot
express overrides them in its own file (``server/overrun/<name>.py``).
"""

import abc

from timebill_ros.server import status
from timebill_ros.engine import stopping
from timebill_ros.timing.goal_budget import BudgetRules
from timebill_ros.timing.online import LEAST


class OverrunPolicy(abc.ABC):
    """Decides how a goal treats its deadline, from admission to its result.

    The defaults are a policy that never acts early: it admits what cannot fit, stops for
    nothing but its own :meth:`stop_criteria`, and keeps a late answer.
    ``code``: the goal's ``overrun_policy`` constant of ``action/Instruct.action``
    (server/status.py mirrors them).
    """

    name = 'base'
    code = status.POLICY_DEFAULT

    @abc.abstractmethod
    def stop_criteria(self, deadline_s, clock):
        """Return the StopCriterion list that interrupts a goal for its deadline.

        deadline_s: absolute deadline in the clock's seconds. clock: monotonic seconds.
        These are checked before every decoder layer, chunk and step.
        """

    # --- admission and the queue ---------------------------------------------------------
    def admits_infeasible(self):
        """Return whether a goal whose least time exceeds its budget is still admitted."""
        return True

    def queue_expiry_s(self, deadline_s, least_s):
        """Return when a queued goal stops waiting, s.

        Its deadline, or (a policy that stops early) the last moment its least time
        ``least_s`` still fits.
        """
        return deadline_s

    def skips_queued(self, own_deadline_s, now_s):
        """Return whether queued goals that come due end SKIPPED while this goal runs.

        now_s: the reaper's clock; own_deadline_s: this running goal's deadline.
        """
        return False

    # --- while it runs ----------------------------------------------------------------
    def prefill_criteria(self, deadline_s, least_rest_s, clock):
        """Return the criteria that stop a prefill for time, besides :meth:`stop_criteria`.

        least_rest_s(n_prefilled) -> s: the least time the rest of the goal takes.
        """
        return []

    def decode_criteria(self, deadline_s, next_step_s, rest_s, clock):
        """Return the criteria that stop decoding for time, besides :meth:`stop_criteria`.

        next_step_s(n_generated) -> s: the next step's time at the bound of
        :meth:`budget_rules`. rest_s(n_generated) -> s: the expected time until the answer
        ends (the predicted length's steps left, N_max's once past it).
        """
        return []

    def gives_up(self, cannot_finish):
        """Return whether the goal stops now, before more work.

        cannot_finish() -> bool: True when that work and one step no longer fit before the
        deadline (called only by a policy whose answer depends on it).
        """
        return False

    def budget_rules(self):
        """Return the timing.goal_budget.BudgetRules a goal's time arithmetic follows."""
        return BudgetRules(step_bound=LEAST, clamps_alpha=False)

    # --- the end ------------------------------------------------------------------------
    def keeps_text(self):
        """Return whether a goal stopped for time answers with its text so far.

        True: COMPLETED, ``truncated``; False: it ends KILLED.
        """
        return False

    def discards_late(self, late_s):
        """Return whether an answer ``late_s`` s past the deadline is discarded.

        True: KILLED; False: COMPLETED with ``deadline_met`` false.
        """
        return False

    def caps_tokens_to_fit(self):
        """Return whether a remote engine's ``max_tokens`` is cut to what fits in time."""
        return False


class StopsWhenLate(OverrunPolicy):
    """A policy that stops a goal once the time model says it can no longer finish.

    Admission refuses a goal that cannot fit at all; a queued one expires when its least
    time no longer fits; prefill stops when its rest plus a step cannot end in time, decoding
    before a step that cannot (Kill, Partial).
    """

    def admits_infeasible(self):
        """Refuse what cannot fit."""
        return False

    def queue_expiry_s(self, deadline_s, least_s):
        """Stop waiting once the least time no longer fits, s."""
        return deadline_s - least_s

    def prefill_criteria(self, deadline_s, least_rest_s, clock):
        """Stop once the rest of the prefill and one step cannot end in time."""
        return [stopping.PrefillCannotFinish(deadline_s, least_rest_s, clock)]

    def decode_criteria(self, deadline_s, next_step_s, rest_s, clock):
        """Stop before a step that cannot end in time (at the bound of budget_rules)."""
        return [stopping.NextStepCannotFinish(deadline_s, next_step_s, clock)]

    def gives_up(self, cannot_finish):
        """Stop when the work ahead and one step cannot fit."""
        return bool(cannot_finish())
