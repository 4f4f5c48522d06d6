"""Kill: the goal stops at its deadline, or earlier once it cannot finish; response discarded."""

from timebill_ros.server import status
from timebill_ros.server.overrun.base import StopsWhenLate
from timebill_ros.engine.stopping import DeadlineStop
from timebill_ros.timing.goal_budget import BudgetRules
from timebill_ros.timing.online import LEAST


class KillPolicy(StopsWhenLate):
    """Stop generation at the deadline (status KILLED).

    A late answer is lost, so alpha* is clamped to alpha_max when nothing fits (the paper's
    Eq. 10c: the goal's best chance), and decoding stops only before a step that surely
    cannot end in time (LEAST).
    """

    name = 'kill'
    code = status.POLICY_KILL

    def stop_criteria(self, deadline_s, clock):
        """Stop once the clock reaches the deadline."""
        return [DeadlineStop(deadline_s, clock)]

    def budget_rules(self):
        """Clamp alpha*; a step's least time decides whether it can still end in time."""
        return BudgetRules(step_bound=LEAST, clamps_alpha=True)

    def discards_late(self, late_s):
        """Discard any answer past the deadline."""
        return late_s > 0

    def caps_tokens_to_fit(self):
        """Cut a remote engine's max_tokens to what fits: what comes later is lost."""
        return True
