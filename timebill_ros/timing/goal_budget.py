"""One goal's time arithmetic: t^_WCET's head, what must still fit, alpha* for the time left.

The goal run (server/goal_run.py) reads the clock and hands the time to these methods; they only
compute, from the online time model (timing.online.TimeModel), so a test drives them with
plain numbers.
"""

import dataclasses

from timebill_ros.timing.batch import ScaledSteps
from timebill_ros.timing.budget import decide_remaining
from timebill_ros.timing.checkpoint import RestPlan, plan_rest, plan_s
from timebill_ros.timing.online import DECIDE, EXPECTED, LEAST, WORST


@dataclasses.dataclass(frozen=True)
class BudgetRules:
    """What a goal's overrun policy asks of its time arithmetic (OverrunPolicy.budget_rules).

    step_bound: the bound of the next step's time a stop before it is judged at (LEAST:
    stop only when the step surely cannot end in time; WORST: when it might not, for an
    answer that must not be late). clamps_alpha: when no eviction ratio fits the time left,
    alpha* is clamped to alpha_max (the paper's Eq. 10c: the goal's best chance, for goals
    whose lateness costs more than eviction); False: the budget's quality rules apply
    (``budget.expected_fallback``, ``budget.keep_cache_when_hopeless``).
    """

    step_bound: str
    clamps_alpha: bool


class GoalBudget:
    """The budget of one goal of ``n_x`` prompt tokens due at ``deadline_s``.

    model: the TimeModel. rules: BudgetRules, from the goal's overrun policy. step_scale:
    its batch's decoding step over a step alone (1.0 alone). mask_step_s: seconds a schema's
    token mask adds to each step (0: no schema). wait_s: expected seconds between its
    eviction and its first batched step. ``decode_model`` is the model with the steps so
    scaled (the model itself when 1.0).
    """

    def __init__(self, model, n_x, deadline_s, rules, step_scale=1.0, mask_step_s=0.0,
                 wait_s=0.0):
        if not isinstance(rules, BudgetRules):
            raise TypeError(f'rules must be a BudgetRules, not {type(rules).__name__}')
        self.model = model
        self.n_x = n_x
        self.deadline_s = deadline_s
        self.rules = rules
        self.step_scale = step_scale
        self.wait_s = wait_s
        self.mask_scale = 1.0
        if mask_step_s > 0:
            self.mask_scale = 1.0 + mask_step_s / max(model.step_s(n_x, EXPECTED), 1e-6)
        scale = step_scale * self.mask_scale
        self.decode_model = model if scale == 1.0 else ScaledSteps(model, scale)
        self.wcet_head_s = 0.0

    def set_head(self, n_chunks, n_cached, overhang_s=None):
        """Predict t^_WCET's head before anything runs: prefill and predictor overhang, s.

        overhang_s: the predictor's time past the prefill when known (a readout's, or 0 for
        a prediction already done); None: the time model's WORST overhang.
        """
        if overhang_s is None:
            overhang_s = self.model.overhang_s(self.n_x, WORST, n_cached)
        self.wcet_head_s = self.model.prefill_s(self.n_x, WORST, n_chunks, n_cached) + overhang_s

    def least_rest_s(self, n_done):
        """Return the least seconds the prefill's rest after ``n_done`` tokens and a step take."""
        model = self.decode_model
        return model.prefill_rest_s(n_done, self.n_x, LEAST) + model.step_s(self.n_x, LEAST)

    def cannot_decode(self, now_s, extra_s):
        """Return True when ``extra_s`` s and one step no longer fit before the deadline.

        Only a policy that gives up early (Kill, Partial) acts on it: the caller asks.
        """
        return now_s + extra_s + self.decode_model.step_s(self.n_x, LEAST) > self.deadline_s

    def next_step_s(self, n_kv):
        """Return the next decoding step's seconds at ``n_kv`` cached tokens, at the bound.

        The rules' step_bound: Kill stops only when the step surely cannot finish (LEAST); an
        anytime answer stops before a step that might not (WORST): it must arrive in time.
        """
        return self.decode_model.step_s(n_kv, self.rules.step_bound)

    def rest_s(self, n_kv, n_generated, n_hat, n_max):
        """Return the expected seconds until the answer ends, at ``n_kv`` cached tokens.

        The steps of N^ - n_generated tokens, or of N_max - n_generated once the answer has
        passed its prediction N^ (tokens), each at the cache as it is (EXPECTED bound).
        """
        left = n_hat - n_generated if n_generated < n_hat else n_max - n_generated
        return max(0, left) * self.decode_model.step_s(n_kv, EXPECTED)

    def decide(self, now_s, n_hat, n_max, budget_config, n_upper=None):
        """Return (timing.budget.Decision for the time left at ``now_s``, t^_WCET in s).

        The two quality-keeping rules serve goals whose answer still arrives (Partial); a
        late Kill answer is lost and a late Skip-Next one skips its successors, so those take
        the paper's clamp to alpha_max (BudgetRules.clamps_alpha).
        """
        cfg = budget_config
        late_kept = not self.rules.clamps_alpha
        decision = decide_remaining(
            self.decode_model, self.deadline_s - now_s - self.wait_s, self.n_x, n_hat, n_max,
            cfg.pessimistic_factor, cfg.alpha_max,
            fixed_alpha=cfg.fixed_alpha if cfg.mode == 'fixed' else None, n_upper=n_upper,
            bound=DECIDE, report_bound=WORST,
            fallback_bound=EXPECTED if cfg.expected_fallback and late_kept else None,
            keep_cache_when_hopeless=cfg.keep_cache_when_hopeless and late_kept)
        return decision, self.wcet_head_s + self.wait_s + decision.remaining_s

    def decide_rest(self, now_s, cache, n_rest, budget_config, n_rest_plan=None):
        """Return the checkpoint's timing.checkpoint.RestPlan for the time left at ``now_s``.

        cache: timing.checkpoint.CacheNow. n_rest: the bound of the tokens still to come;
        n_rest_plan: those expected (an eviction is sized for them; None: ``n_rest``).
        Solved at DECIDE, reported at WORST (t^_WCET's rest). When not even alpha_max fits,
        a goal whose late answer still arrives (Partial, ``keep_cache_when_hopeless``)
        evicts nothing more; Kill and Skip-Next take alpha_max (as :meth:`decide`).
        """
        cfg = budget_config
        time_left_s = self.deadline_s - now_s - self.wait_s
        plan = plan_rest(self.decode_model, time_left_s, cache, n_rest, cfg.checkpoint_tokens,
                         cfg.alpha_max, DECIDE, report_bound=WORST, n_rest_plan=n_rest_plan)
        if plan.fits or self.rules.clamps_alpha or not cfg.keep_cache_when_hopeless:
            return plan
        if plan_rest(self.decode_model, time_left_s, cache, n_rest, cfg.checkpoint_tokens,
                     cfg.alpha_max, EXPECTED, n_rest_plan=n_rest_plan).fits:
            return plan
        keep_s = plan_s(self.decode_model, cache, cache.alpha_now, n_rest,
                        cfg.checkpoint_tokens, cfg.alpha_max, WORST)
        return RestPlan(alpha=cache.alpha_now, rest_s=keep_s, fits=False, evicts=False,
                        latest_s=keep_s)
