"""Is t^_WCET an upper bound? Run real prompts, compare actual times with Eq. 9 per k.

Each goal runs as the server runs it with no eviction (alpha = 0): the length predictor gives
N^, then prefill and greedy decoding until EOS or N_max. For a calibration and a pessimistic
factor k, t^_WCET = t^_prefill(N_x) + t^_decode(N_x, 0, N^_W) with N^_W = min(k N^, N_max)
(TimeBill Eq. 9); a goal *exceeds* when its actual prefill + decode seconds are larger.
"""

import dataclasses

import numpy as np

from timebill_ros.timing.budget import pessimistic_tokens
from timebill_ros.engine.stopping import EosStop, StopCriteria

K_VALUES = tuple(range(1, 9))


@dataclasses.dataclass(frozen=True)
class GoalTiming:
    """One goal: prompt id, N_x, N^ and actual N (tokens), actual seconds (prefill + decode)."""

    prompt_id: str
    n_x: int
    n_hat: int
    n_tokens: int
    actual_s: float


def run_goals(engine, predictor, prompts, n_max, progress=None):
    """Run ``prompts`` ([(id, text)]) through the engine; return a list of GoalTiming.

    n_max: N_max of every goal, tokens. The predictor runs before the prefill (not beside
    it), so its CPU use does not slow the timed prefill.
    """
    goals = []
    for prompt_id, prompt in prompts:
        ids = engine.encode(prompt)
        n_hat = predictor.predict(prompt, ids, n_max)
        state = engine.prefill(ids, StopCriteria())
        out = engine.decode(state, n_max, StopCriteria([EosStop(engine.eos_token_ids)]))
        goals.append(GoalTiming(prompt_id, len(ids), n_hat, len(out.token_ids),
                                state.prefill_s + out.decode_s))
        if progress:
            progress(f'[{len(goals)}/{len(prompts)}] {prompt_id}: N_x={len(ids)} '
                     f'N^={n_hat} N={len(out.token_ids)} {goals[-1].actual_s:.2f} s')
    return goals


def exceed_table(goals, coefficients, n_max, k_values=K_VALUES):
    """Return {k: (share of goals over t^_WCET, share with N > N^_W)} for one calibration.

    coefficients: Eq. 4 coefficients (TimingCoefficients). Shares are fractions in [0, 1].
    """
    if not goals:
        raise ValueError('need at least one goal')
    table = {}
    for k in k_values:
        over = longer = 0
        for goal in goals:
            n_w = pessimistic_tokens(goal.n_hat, k, n_max)
            wcet = coefficients.e2e_s(goal.n_x, 0.0, n_w)
            over += goal.actual_s > wcet
            longer += goal.n_tokens > n_w
        table[k] = (over / len(goals), longer / len(goals))
    return table


def time_ratios(goals, coefficients):
    """Return (mean, 90th percentile, max) of actual / t^_e2e(N_x, 0, actual N) over goals.

    This is the time model's own error, with the length known: above 1 means the goal ran
    slower than Eq. 8 predicts for the answer it actually produced.
    """
    if not goals:
        raise ValueError('need at least one goal')
    ratios = np.array([g.actual_s / coefficients.e2e_s(g.n_x, 0.0, g.n_tokens) for g in goals])
    return float(ratios.mean()), float(np.percentile(ratios, 90)), float(ratios.max())
