"""A goal's checkpoints while it decodes: re-predict the rest, re-decide the eviction.

timebill-online (``budget.checkpoint_tokens`` = m > 0). The decode loop calls the goal's
:class:`GoalCheckpoints` before each step (engine.DecodeBatch's ``checkpoint``); every m
tokens, and at any step where the prompt's bound on the answer's end moves later, it bounds
the tokens still to come (:class:`RestLength`), asks the goal's budget for the rescue rule's
alpha (timing/checkpoint.py) and evicts more of the prompt's KV when that alpha is more than
what is evicted already. Each re-decision is recorded for the result.
"""

import dataclasses

from timebill_ros.engine import GenerationStopped
from timebill_ros.engine import stopping
from timebill_ros.timing.checkpoint import CacheNow
from timebill_ros.timing.online import LEAST


class RestLength:
    """The bound of the tokens still to come after n were generated, tokens.

    n_hat, n_w: N^ and N^_W of the prediction; n_max: N_max. rest_bounds: None, or
    ``n -> (N^_rem, N^_rem,q) or None`` from the predictor's length distribution
    conditioned on the answer not having ended by token n
    (predictors.length_distribution.OutputFormat.rest_bounds). ``decode_bounds`` (set before
    decoding, the same form): the decode readout's, read first (predictors/decode_readout.py);
    an error there is kept in ``decode_error`` and the prefill's distribution reads instead.
    Without either (or where they give None) the rest is N^_W - n, and N_max - n once the
    answer has run past N^_W. ``loop_steps`` (set before decoding; None: no loop guard):
    ``() -> tokens or None``, the goal's engine.stopping.LoopGuard.steps_to_fire: while the
    answer is caught in a loop, both bounds are at most the steps until the guard ends it
    (what no length readout learned: the loops an eviction causes).
    """

    def __init__(self, n_hat, n_w, n_max, rest_bounds=None):
        self.n_hat, self.n_w, self.n_max = n_hat, n_w, n_max
        self.rest_bounds = rest_bounds
        self.decode_bounds = None
        self.decode_error = None
        self.loop_steps = None

    def _read(self, n_generated):
        """Return the first (N^_rem, N^_rem,q) the readouts give, or None."""
        if self.decode_bounds is not None and self.decode_error is None:
            try:
                read = self.decode_bounds(n_generated)
            except Exception as exc:  # a broken file must not end the goal
                self.decode_error = f'{type(exc).__name__}: {exc}'
                read = None
            if read is not None:
                return read
        return None if self.rest_bounds is None else self.rest_bounds(n_generated)

    def bounds(self, n_generated):
        """Return (N^_rem, N^_rem,q) after ``n_generated`` tokens, each in [0, N_max - n]."""
        point, upper = self._clip(n_generated, self._read(n_generated))
        looping = None if self.loop_steps is None else self.loop_steps()
        if looping is not None:
            point, upper = min(point, looping), min(upper, looping)
        return point, upper

    def prompt_end(self, n_generated):
        """Return where the prompt's bound ends the answer now, n + N^_rem,q (tokens).

        The prefill readout's distribution conditioned on N > n (or N^_W, then N_max),
        never the decode readout: a few array operations, cheap enough for every step.
        """
        read = None if self.rest_bounds is None else self.rest_bounds(n_generated)
        return n_generated + self._clip(n_generated, read)[1]

    def _clip(self, n_generated, read):
        """Return ``read`` (or the fallback where None) clipped to [0, N_max - n]."""
        left = max(0, self.n_max - n_generated)
        if read is None:
            upper = self.n_w - n_generated if n_generated < self.n_w else left
            point = self.n_hat - n_generated if n_generated < self.n_hat else upper
            read = (point, upper)
        point, upper = read
        return min(max(0, point), left), min(max(0, upper, point), left)


@dataclasses.dataclass(frozen=True)
class Redecision:
    """One checkpoint: tokens generated, alpha after it, N^_rem / N^_rem,q, t^_WCET (s)."""

    n_generated: int
    alpha: float
    rest_tokens: int
    rest_upper_tokens: int
    wcet_s: float


class GoalCheckpoints:
    """Called before each decoding step of one goal; acts every ``every`` tokens.

    run: the goal's GoalRun (engine, budget, clock, job). state: its engine PrefillState.
    rest: a :class:`RestLength`. alpha: the share of the prompt evicted after the prefill.
    """

    def __init__(self, run, state, rest, alpha):
        self.run, self.state, self.rest = run, state, rest
        self.every = run.runner.config.budget.checkpoint_tokens
        self.alpha = alpha
        self.redecisions = []
        self.evictions = []  # (n_generated, seconds, cached tokens after)
        self.watched_end = rest.prompt_end(1)  # the answer's end the first decision saw

    def __call__(self, n_generated):
        """Return a stop reason or None; re-decide at tokens m + 1, 2m + 1, ... and between.

        Between checkpoints it re-decides where the prompt's bound on the answer's end
        (:meth:`RestLength.prompt_end`) has moved later than at the last decision: the rest
        may then no longer fit, and waiting for the next checkpoint would spend up to m - 1
        steps of it. A bound that moves earlier leaves more room, and the plan never gives
        evicted KV back, so that needs no decision.
        """
        if n_generated <= 1:
            return None
        end = self.rest.prompt_end(n_generated)
        if (n_generated - 1) % self.every and end <= self.watched_end:
            return None
        self.watched_end = end
        return self._redecide(n_generated)

    def _redecide(self, n_generated):
        """Bound the rest, recompute alpha under the rescue rule, evict if it grew."""
        run, state = self.run, self.state
        job = run.job
        point, upper = self.rest.bounds(n_generated)
        cache = CacheNow(n_x=state.n_x, n_prompt_kv=state.n_prompt_kv,
                         n_answer_kv=state.n_kv - state.n_prompt_kv, alpha_now=self.alpha)
        now = run.clock()
        plan = run.budget.decide_rest(now, cache, upper, run.runner.config.budget, point)
        self.redecisions.append(Redecision(n_generated, plan.alpha, point, upper,
                                           now - job.started_s + plan.latest_s))
        if not plan.evicts:
            return None
        return self._evict(n_generated, plan.alpha)

    def _evict(self, n_generated, alpha):
        """Evict to ``alpha``; return a stop reason when the goal stopped instead."""
        run, state = self.run, self.state
        if run.job.policy.gives_up(lambda: run.budget.cannot_decode(
                run.clock(), run.model.evict_s(state.n_prompt_kv, LEAST))):
            return stopping.CANNOT_FINISH
        first = state.prompt_scores is None
        n_prompt = state.n_prompt_kv
        start = run.runner.timed_now()
        try:
            run.engine.evict(state, alpha, interrupt=run.interrupt, keep_inputs=True)
        except GenerationStopped as stop:
            return stop.reason
        took_s = run.runner.timed_now() - start
        if first:  # a first eviction scores the prompt: what the time model's phase is
            run.model.observe_evict(n_prompt, took_s)
        self.alpha = alpha
        self.evictions.append((n_generated, took_s, state.n_kv))
        return None

    def segments(self, n_kv_first, step_durations_s):
        """Return [(cached tokens at its first step, [step seconds])] between evictions.

        The eviction's seconds are taken out of the step they ran in (before its forward).
        """
        steps = list(step_durations_s)
        out, begin, n_kv = [], 0, n_kv_first
        for n_generated, took_s, n_kv_after in self.evictions:
            index = n_generated - 1  # the step from token n to n + 1
            if index < len(steps):
                steps[index] = max(0.0, steps[index] - took_s)
            out.append((n_kv, steps[begin:index]))
            begin, n_kv = index, n_kv_after
        out.append((n_kv, steps[begin:]))
        return [(kv, seg) for kv, seg in out if seg]
