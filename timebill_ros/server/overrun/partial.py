"""Partial (anytime): at the deadline decoding stops and the text so far is the answer.

A planner often prefers half a plan to none, as llama.cpp's time cap gives. The goal ends
COMPLETED with ``truncated`` set and ``deadline_met`` true; a goal stopped before it produced
any text (its prefill cannot end in time) ends KILLED, as under Kill. alpha* is chosen as for
every goal (Eq. 11 with N^_W): eviction is never needed to meet the deadline here, it makes
room for more of the answer before it.
"""

from timebill_ros.server import status
from timebill_ros.server.overrun.base import StopsWhenLate
from timebill_ros.engine.stopping import DeadlineStop
from timebill_ros.timing.goal_budget import BudgetRules
from timebill_ros.timing.online import WORST


class PartialPolicy(StopsWhenLate):
    """Stop decoding at the deadline and keep the text."""

    name = 'partial'
    code = status.POLICY_PARTIAL

    def stop_criteria(self, deadline_s, clock):
        """Stop once the clock reaches the deadline."""
        return [DeadlineStop(deadline_s, clock)]

    def budget_rules(self):
        """Stop before a step that might not end in time (WORST); no clamp.

        The answer must not be late; the budget's quality rules apply, since the answer
        arrives anyway.
        """
        return BudgetRules(step_bound=WORST, clamps_alpha=False)

    def keeps_text(self):
        """Answer with the text at the deadline."""
        return True
