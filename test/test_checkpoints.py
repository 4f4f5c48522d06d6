"""timebill-online's checkpoints (server/checkpoints.py) on the tiny engine and a set clock.

The real engine decodes and evicts; the clock moves by what the time model says each step
costs at the cache the step really has, so every decision is exact on any machine.
"""

import math
import types

import pytest

from timebill_ros.config import BudgetConfig, OnlineSettings, ServerConfig
from timebill_ros.engine.stopping import StopCriteria
from timebill_ros.engine.stopping import StopCriterion
from timebill_ros.server import status
from timebill_ros.server.checkpoints import GoalCheckpoints, RestLength
from timebill_ros.server.overrun import POLICIES
from timebill_ros.timing.budget import decide_remaining
from timebill_ros.timing.goal_budget import GoalBudget
from timebill_ros.timing.model import TimingCoefficients
from timebill_ros.timing.online import EXPECTED, TimeModel

# A step of 2 ms + 0.2 ms per cached token: ~24 ms over the ~110-token prompt.
COEFFICIENTS = TimingCoefficients(a=0.0, b=1e-4, c=0.0, p=2e-4, q=2e-3)
PROMPT = ('Here is the robot log: ' + ' '.join(f'event {i} ok;' for i in range(30))
          + ' Summarize it.')
N_MAX, EVERY = 40, 8


class SetClock:
    """Seconds that move only when told."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class ModelSteps(StopCriterion):
    """Advances the clock by each step's modelled seconds at the cache it runs with."""

    def __init__(self, clock, model, state):
        self.clock, self.model, self.state = clock, model, state

    def should_stop(self, n_generated, last_token_id, n_prefilled=None):
        if n_generated >= 1:  # the step after this check runs at the cache as it is
            self.clock.now += self.model.step_s(self.state.n_kv)
        return None


def run_goal(engine, budget_s, policy='kill', rest=None):
    """Prefill PROMPT, decide with the rescue rule, decode N_MAX tokens under checkpoints.

    Returns (the GoalCheckpoints, the decode result, seconds from the start to the end).
    """
    model = TimeModel(COEFFICIENTS, OnlineSettings(enabled=False))
    clock = SetClock()
    state = engine.prefill(engine.encode(PROMPT), StopCriteria())
    start = clock()
    budget = GoalBudget(model, state.n_x, start + budget_s, POLICIES[policy].budget_rules())
    config = BudgetConfig(checkpoint_tokens=EVERY, upper_quantile=0.0)
    job = types.SimpleNamespace(started_s=start, policy=POLICIES[policy])
    runner = types.SimpleNamespace(config=types.SimpleNamespace(budget=config),
                                   timed_now=clock)
    run = types.SimpleNamespace(clock=clock, job=job, budget=budget, model=model,
                                engine=engine, runner=runner, interrupt=StopCriteria())
    # Nothing evicted after the prefill: the tests' budgets let the first decision wait.
    rest = rest or RestLength(N_MAX, N_MAX, N_MAX)
    first = GoalCheckpoints(run, state, rest, 0.0)
    out = engine.decode(state, N_MAX, StopCriteria([ModelSteps(clock, model, state)]),
                        checkpoint=first)
    return first, out, clock() - start


@pytest.fixture
def engine(make_tiny_engine):
    return make_tiny_engine()


def full_cache_s(engine):
    n_x = len(engine.encode(PROMPT))
    return sum(COEFFICIENTS.decode_step_s(n_x + i) for i in range(N_MAX - 1))


def test_a_roomy_budget_never_evicts(engine):
    checkpoints, out, took_s = run_goal(engine, 2 * full_cache_s(engine))
    assert [r.n_generated for r in checkpoints.redecisions] == [9, 17, 25, 33]
    assert all(r.alpha == 0.0 for r in checkpoints.redecisions)
    assert not checkpoints.evictions and len(out.token_ids) == N_MAX


def test_a_tight_budget_evicts_late_and_keeps_the_deadline(engine):
    """0.7 x the full-cache time: Eq. 11 evicts before token 2; the checkpoints wait."""
    budget_s = 0.7 * full_cache_s(engine)
    n_x = len(engine.encode(PROMPT))
    model = TimeModel(COEFFICIENTS, OnlineSettings(enabled=False))
    one_shot = decide_remaining(model, budget_s, n_x, N_MAX, N_MAX, 1.0, 0.95,
                                bound=EXPECTED)
    assert one_shot.alpha > 0.3
    checkpoints, out, took_s = run_goal(engine, budget_s)
    alphas = [r.alpha for r in checkpoints.redecisions]
    assert alphas[0] == 0.0 and alphas[-1] > 0 and alphas == sorted(alphas)
    assert checkpoints.evictions and len(out.token_ids) == N_MAX
    assert took_s <= budget_s
    # Each eviction left the answer's KV in the cache: prompt kept + the answer so far.
    for n_generated, _, n_kv in checkpoints.evictions:
        assert n_kv >= n_generated - 1


def test_a_bound_that_moves_later_is_decided_at_once(engine):
    """The prompt's bound moves the answer's end from 16 to N_max at token 6: decide there.

    Buckets of 16 tokens: 90 % of the answers end by 16, 10 % in 49-64. At the 0.85 level the
    end is 16 until token 6, when less than 85 % of what is left still ends by 16.
    """
    from timebill_ros.predictors.length_distribution import OutputFormat
    fmt = OutputFormat('classification', bucket_tokens=16, n_model=128, readout='median')
    logits = [math.log(0.9), -1e9, -1e9, math.log(0.1)] + [-1e9] * 4
    rest = RestLength(16, 16, N_MAX, lambda n: fmt.rest_bounds(logits, N_MAX, n, 0.85))
    assert [rest.prompt_end(n) for n in (1, 5, 6, 20)] == [16, 16, N_MAX, N_MAX]
    checkpoints, out, _ = run_goal(engine, 2 * full_cache_s(engine), rest=rest)
    assert [r.n_generated for r in checkpoints.redecisions] == [6, 9, 17, 25, 33]
    assert checkpoints.redecisions[0].rest_upper_tokens == N_MAX - 6
    # Without a distribution the bound moves once, when the answer passes N^_W.
    checkpoints, out, _ = run_goal(engine, 2 * full_cache_s(engine),
                                   rest=RestLength(10, 12, N_MAX))
    assert [r.n_generated for r in checkpoints.redecisions] == [9, 12, 17, 25, 33]


def test_the_segments_split_the_steps_at_each_eviction(engine):
    checkpoints, out, _ = run_goal(engine, 0.7 * full_cache_s(engine))
    steps = [0.01] * (N_MAX - 1)
    segments = checkpoints.segments(200, steps)
    assert sum(len(s) for _, s in segments) == N_MAX - 1
    assert segments[0][0] == 200 and len(segments) == len(checkpoints.evictions) + 1


def test_the_rest_comes_from_the_bound_then_n_max():
    rest = RestLength(n_hat=20, n_w=30, n_max=40)
    assert rest.bounds(9) == (11, 21)
    assert rest.bounds(25) == (5, 5)  # past N^: the point is the bound
    assert rest.bounds(31) == (9, 9)  # past N^_W: up to N_max
    assert rest.bounds(40) == (0, 0)


def test_a_loop_bounds_the_rest_by_the_steps_until_the_guard_ends_it():
    rest = RestLength(n_hat=20, n_w=30, n_max=40)
    looping = [None]
    rest.loop_steps = lambda: looping[0]
    assert rest.bounds(9) == (11, 21)
    looping[0] = 6
    assert rest.bounds(9) == (6, 6)
    looping[0] = 25  # never above what the readouts give
    assert rest.bounds(9) == (11, 21)
    assert rest.prompt_end(9) == 30  # the watch for a later end reads the prompt only


def test_the_rest_is_read_from_the_distribution_given_the_tokens_so_far():
    """Four equally likely 16-token buckets: the rest shrinks to what is left above n."""
    from timebill_ros.predictors.length_distribution import OutputFormat
    fmt = OutputFormat('classification', bucket_tokens=16, n_model=128, readout='median')
    logits = [0.0] * 4 + [-1e9] * 4  # lengths 1-64 only; the top bucket (>= 128) empty
    assert fmt.rest_bounds(logits, 128, 0, 0.9) == (32, 64)
    # At token 40 half of bucket 2 (33-48) is left and all of bucket 3 (49-64).
    assert fmt.rest_bounds(logits, 128, 40, 0.9) == (24, 24)
    assert fmt.rest_bounds(logits, 128, 70, 0.9) is None  # past every length it allows
    assert OutputFormat('regression', 16, 128, 'median').rest_bounds([0.5], 128, 0, 0.9) \
        is None


@pytest.mark.parametrize('policy, alpha', [('kill', 0.95), ('skip_next', 0.95),
                                           ('partial', 0.0)])
def test_a_hopeless_checkpoint_follows_the_policy(policy, alpha):
    """Not even alpha_max fits: Kill and Skip-Next take it, Partial keeps its cache."""
    from timebill_ros.timing.checkpoint import CacheNow
    model = TimeModel(COEFFICIENTS, OnlineSettings(enabled=False))
    budget = GoalBudget(model, 100, 0.001, POLICIES[policy].budget_rules())
    plan = budget.decide_rest(0.0, CacheNow(100, 100, 8, 0.0), 30,
                              BudgetConfig(checkpoint_tokens=EVERY))
    assert plan.alpha == alpha and not plan.fits


def test_a_looping_answer_is_bounded_by_the_guard_at_its_checkpoints(
        slow_model, smollm2_tokenizer):
    """slow_model's greedy answer settles into a cycle: the guard ends it, the rest knew."""
    import threading
    from timebill_ros.config import EngineConfig, EvictionConfig, PrefixCacheConfig
    from timebill_ros.engine.llm_engine import LlmEngine
    from timebill_ros.predictors import FallbackPredictor
    from timebill_ros.server.goals import GoalRequest
    from timebill_ros.server.service import TimeBillService
    engine = LlmEngine(EngineConfig(), EvictionConfig(), model=slow_model,
                       tokenizer=smollm2_tokenizer, prefix_cache=PrefixCacheConfig(enabled=False))
    service = TimeBillService(ServerConfig(budget=BudgetConfig(checkpoint_tokens=4)), engine,
                              FallbackPredictor(),
                              TimingCoefficients(a=1e-9, b=1e-5, c=1e-3, p=1e-6, q=1e-3))
    service.start()
    try:
        done, results = threading.Event(), []
        service.submit(GoalRequest('Here is the robot log: all ok. Summarize it.',
                                   budget_s=100_000.0, max_new_tokens=120),
                       lambda feedback: None,
                       lambda result: (results.append(result), done.set()))
        assert done.wait(120)
    finally:
        service.shutdown()
    result = results[0]
    assert result.status == status.COMPLETED and 'repeated itself' in result.message
    # The last checkpoint's rest was the guard's: exact (N^ - n would be 60-odd tokens off),
    # counted against the tokens generated, not the ones the cut kept.
    assert result.rest_error_tokens == 0
    assert result.checkpoint_tokens[-1] > result.response_tokens
