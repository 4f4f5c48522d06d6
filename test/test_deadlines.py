"""Deadline rules of the service, on a clock that moves only when the model computes.

The tiny random-weight Llama (2 decoder layers, real SmolLM2 tokenizer) runs for real; a
forward pre-hook on each decoder layer advances a fake clock by ``BASE_S + PER_TOKEN_S x
tokens`` - what that layer "costs" - and the service, the engine and every stop criterion
read that clock. So Kill / cancel overshoots, early kills, chunk sizes and WCETs are exact and
do not depend on this machine's speed.
"""

import threading

import pytest

from timebill_ros.config import (AdmissionConfig, EngineConfig, QueueConfig, ServerConfig,
                                 TimingConfig)
from timebill_ros.engine import LlmEngine
from timebill_ros.server.backends.local import build_time_model
from timebill_ros.predictors import FallbackPredictor, LengthPredictor
from timebill_ros.server import status
from timebill_ros.server.goals import GoalRequest
from timebill_ros.server.service import TimeBillService
from timebill_ros.timing.model import Calibration, TimingCoefficients
from timebill_ros.timing.online import DECODE, PREFILL, TimeModel

BASE_S = 2e-3        # fake cost of one decoder-layer call, seconds (reading the weights) ...
PER_TOKEN_S = 4.5e-5  # ... plus this per token in it (a decode step ~ 45 prefill tokens)
N_LAYERS = 2        # the tiny model's decoder layers
# Eq. 4 of that cost model: a chunk of n tokens costs L (BASE + PER_TOKEN n); a step L x
# (BASE + PER_TOKEN). Exact for single-chunk prefills.
TRUE = TimingCoefficients(a=0.0, b=N_LAYERS * PER_TOKEN_S, c=N_LAYERS * BASE_S, p=0.0,
                          q=N_LAYERS * (BASE_S + PER_TOKEN_S))
# A calibration far faster than the fake machine: nothing is ever predicted infeasible.
OPTIMISTIC = TimingCoefficients(a=0.0, b=1e-9, c=1e-9, p=0.0, q=1e-9)
STEP_S = TRUE.q
LONG = 1e6
PROMPT = ('Here is the robot log: ' + ' '.join(f'event {i} ok;' for i in range(60))
          + ' Summarize it in three bullet points.')


class FakeClock:
    """Seconds that advance only in the layer hook (and by ``advance``)."""

    def __init__(self):
        self.now = 1000.0
        self.layer_calls = []   # tokens of each decoder-layer call, in order

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds

    def layer_hook(self, module, args, kwargs):
        hidden = kwargs['hidden_states'] if 'hidden_states' in kwargs else args[0]
        self.layer_calls.append(hidden.shape[1])
        self.now += BASE_S + PER_TOKEN_S * hidden.shape[1]


class CountingEngine(LlmEngine):
    """The real engine; counts prefills; an optional hook runs inside each eviction layer."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.prefills = 0
        self.on_evict_layer = None

    def prefill(self, input_ids, stop, **kwargs):
        self.prefills += 1
        return super().prefill(input_ids, stop, **kwargs)

    def _evict_layer(self, cache, layer_idx, inputs, n_keep):
        if self.on_evict_layer is not None:
            self.on_evict_layer()
        super()._evict_layer(cache, layer_idx, inputs, n_keep)


class Goal:
    """One submitted goal: feedback, result, and the clock at its terminal callback."""

    def __init__(self, service, clock, request, on_feedback=None):
        self.clock = clock
        self.results, self.feedback = [], []
        self.done = threading.Event()
        self.extra_feedback = on_feedback
        self.job = service.submit(request, self._feedback, self._done)

    def _feedback(self, feedback):
        self.feedback.append(feedback)
        if self.extra_feedback is not None:
            self.extra_feedback(feedback)

    def _done(self, result):
        self.end_s = self.clock()
        self.results.append(result)
        self.done.set()

    def wait(self):
        assert self.done.wait(60), 'no result'
        assert len(self.results) == 1
        return self.results[0]


@pytest.fixture
def clock(tiny_model):
    fake = FakeClock()
    handles = [layer.register_forward_pre_hook(fake.layer_hook, with_kwargs=True)
               for layer in tiny_model.model.layers]
    yield fake
    for handle in handles:
        handle.remove()


@pytest.fixture
def make_service(tiny_model, smollm2_tokenizer, clock):
    services = []

    def build(coefficients=TRUE, predictor=None, online=False, admission='feasibility',
              chunk=64, stop_bound_s=0.0, n_max=16, state_path=None):
        # transformers' forward: the fake clock advances in its decoder layers' hooks. The
        # lean forward checks interrupts at the same places (test_engine runs both).
        engine_cfg = EngineConfig(max_new_tokens=n_max, max_model_new_tokens=512,
                                  prefill_chunk_tokens=chunk, feedback_every_tokens=1,
                                  stop_bound_s=stop_bound_s, forward='transformers')
        config = ServerConfig(engine=engine_cfg, queue=QueueConfig(max_depth=4),
                              timing=TimingConfig(online=online),
                              admission=AdmissionConfig(policy=admission))
        engine = CountingEngine(engine_cfg, config.eviction, model=tiny_model,
                                tokenizer=smollm2_tokenizer, clock=clock)
        service = TimeBillService(config, engine, predictor or FallbackPredictor(),
                                  coefficients, clock=clock, state_path=state_path)
        service.start()
        services.append(service)
        return service

    yield build
    for service in services:
        service.shutdown()


def _n_x(service, prompt=PROMPT):
    return len(service.engine.encode(prompt))


def _chunk_layer_s(tokens):
    return BASE_S + PER_TOKEN_S * tokens


def _prefill_cost(n_x, chunk):
    """Return the fake seconds of a prefill in ``chunk``-token chunks (last one shorter)."""
    sizes = [chunk] * (n_x // chunk) + ([n_x % chunk] if n_x % chunk else [])
    return sum(N_LAYERS * _chunk_layer_s(size) for size in sizes)


BIG_BOUND = 1.0  # engine.stop_bound_s that lets every chunk be engine.prefill_chunk_tokens


# --- admission --------------------------------------------------------------------------
def test_infeasible_kill_goal_is_rejected_at_once_and_the_model_never_runs(make_service,
                                                                           clock):
    service = make_service()
    n_x = _n_x(service)
    goal = Goal(service, clock, GoalRequest(PROMPT, budget_s=0.5 * TRUE.prefill_s(n_x)))
    result = goal.wait()
    least = service.time_model.least_e2e_s(n_x)
    assert goal.job is None and result.status == status.REJECTED and result.infeasible
    assert result.error_code == status.ERROR_INFEASIBLE
    assert result.message == (f'infeasible: needs at least {least:.2f} s, budget '
                              f'{result.budget_s:.2f} s')
    assert result.min_time_s == pytest.approx(least) and result.prompt_tokens == n_x
    assert service.engine.prefills == 0 and clock.layer_calls == []


@pytest.mark.parametrize('policy', [status.POLICY_KILL, status.POLICY_PARTIAL])
def test_least_time_is_the_admission_threshold(make_service, clock, policy):
    service = make_service()
    n_x = _n_x(service)
    least = service.time_model.least_e2e_s(n_x)
    refused = Goal(service, clock, GoalRequest(PROMPT, budget_s=least * 0.999,
                                               overrun_policy=policy)).wait()
    admitted = Goal(service, clock, GoalRequest(PROMPT, budget_s=least * 1.001,
                                                overrun_policy=policy)).wait()
    assert refused.status == status.REJECTED and refused.infeasible
    assert admitted.status != status.REJECTED and not admitted.infeasible


def test_infeasible_skip_next_goal_runs_late_and_says_so(make_service, clock):
    service = make_service()
    n_x = _n_x(service)
    result = Goal(service, clock, GoalRequest(PROMPT, budget_s=0.3 * TRUE.prefill_s(n_x),
                                              overrun_policy=status.POLICY_SKIP_NEXT)).wait()
    assert result.status == status.COMPLETED and not result.deadline_met
    assert result.infeasible and 'infeasible: needs at least' in result.message
    assert 'late (skip_next)' in result.message


def test_admission_none_runs_the_goal_and_early_kill_stops_it(make_service, clock):
    service = make_service(admission='none')
    n_x = _n_x(service)
    goal = Goal(service, clock, GoalRequest(PROMPT, budget_s=0.5 * TRUE.prefill_s(n_x)))
    result = goal.wait()
    assert result.status == status.KILLED and 'can no longer finish' in result.message
    assert result.kill_latency_s < 0 and result.stop_phase == 'prefill'
    assert clock.layer_calls == []  # stopped at the first chunk edge: nothing computed


def test_a_goal_that_waited_too_long_is_rejected_when_dequeued(make_service, clock):
    service = make_service()
    n_x = _n_x(service)
    release = threading.Event()
    blocked = threading.Event()

    def hold(feedback):  # the first goal holds the executor in its decode phase
        if feedback.phase == status.PHASE_DECODE and not release.is_set():
            blocked.set()
            release.wait(30)

    # Two tokens: once released, the first goal's last step moves the layer-hook clock
    # only a little, so the second goal is judged before its deadline passes, whether the
    # reaper or the executor's dequeue check gets to it first.
    first = Goal(service, clock, GoalRequest('Hi.', budget_s=LONG, max_new_tokens=2),
                 on_feedback=hold)
    assert blocked.wait(30)
    budget = 1.5 * TRUE.prefill_s(n_x)
    second = Goal(service, clock, GoalRequest(PROMPT, budget_s=budget))
    assert second.job is not None                     # feasible at receipt
    clock.advance(budget - 0.5 * TRUE.prefill_s(n_x))  # the first goal holds it up
    release.set()
    result = second.wait()
    assert first.wait().status == status.COMPLETED
    assert result.status == status.REJECTED and result.infeasible
    assert 'infeasible after' in result.message and 'queued' in result.message
    assert service.engine.prefills == 1


# --- kill and cancel land within one layer, in every phase -------------------------------
@pytest.mark.parametrize('fraction', [0.1, 0.37, 0.63, 0.99])
def test_kill_in_prefill_lands_within_one_layer_of_the_deadline(make_service, clock,
                                                                fraction):
    # One chunk holds the whole prompt and the calibration is optimistic: only the layer
    # checks can stop the goal before the chunk ends.
    service = make_service(coefficients=OPTIMISTIC, chunk=512, stop_bound_s=BIG_BOUND)
    n_x = _n_x(service)
    prefill_s = _prefill_cost(n_x, 512)
    goal = Goal(service, clock, GoalRequest(PROMPT, budget_s=fraction * prefill_s))
    result = goal.wait()
    assert result.status == status.KILLED and result.stop_phase == 'prefill'
    assert 0 <= result.kill_latency_s <= _chunk_layer_s(n_x)
    if fraction < 0.5:  # the deadline fell in the first layer: the second never ran
        assert clock.layer_calls == [n_x]


def _largest_chunk(allowed_chunk_s):
    """Return the largest chunk (>= 16) whose Eq. 4a time under TRUE fits ``allowed_chunk_s``."""
    return max(n for n in range(16, 513) if TRUE.b * n + TRUE.c <= allowed_chunk_s)


def _chunks(clock):
    """Return the prefill chunk sizes seen (one per chunk; the last call is a decode step)."""
    return clock.layer_calls[:-N_LAYERS][::N_LAYERS]


def test_chunks_are_sized_so_one_layer_fits_the_stop_bound(make_service, clock):
    bound_s = 6e-3
    service = make_service(chunk=512, stop_bound_s=bound_s)
    n_x = _n_x(service)
    Goal(service, clock, GoalRequest(PROMPT, budget_s=LONG, max_new_tokens=2)).wait()
    largest = _largest_chunk(bound_s * N_LAYERS)
    assert 16 < largest < 512 and n_x > largest
    assert sum(_chunks(clock)) == n_x and max(_chunks(clock)) == largest
    assert all(_chunk_layer_s(size) <= bound_s for size in _chunks(clock))


def test_default_stop_bound_is_one_decoding_step(make_service, clock):
    service = make_service(chunk=512)
    n_x = _n_x(service)
    Goal(service, clock, GoalRequest(PROMPT, budget_s=LONG, max_new_tokens=2)).wait()
    largest = _largest_chunk(STEP_S * N_LAYERS)
    assert 16 < largest < 512 and n_x > largest
    assert max(_chunks(clock)) == largest
    assert all(_chunk_layer_s(size) <= STEP_S for size in _chunks(clock))


def test_chunks_ignore_the_wcet_margin_and_extra_chunks_are_not_a_slow_machine(
        make_service, clock):
    """Chunks come from EXPECTED times; a prefill in more chunks is charged c per chunk.

    Regression: chunks sized from WORST shrank with the margin, and the prefill of many small
    chunks then read as a slower machine, which shrank them further.
    """
    bound_s = 6e-3
    # Online, no residuals yet: WORST = prior_margin (1.3) x EXPECTED.
    service = make_service(chunk=512, stop_bound_s=bound_s, online=True)
    n_x = _n_x(service)
    Goal(service, clock, GoalRequest(PROMPT, budget_s=LONG, max_new_tokens=2)).wait()
    assert max(_chunks(clock)) == _largest_chunk(bound_s * N_LAYERS)
    assert len(_chunks(clock)) > 1 and n_x < 512  # the calibration would take one chunk
    # Each chunk paid its c exactly as Eq. 4a + c per extra chunk says: speed factor 1.
    assert service.time_model.status(PREFILL).speed_factor == pytest.approx(1.0)


def test_early_kill_in_prefill_frees_the_executor_before_the_deadline(make_service, clock):
    service = make_service(chunk=16)
    n_x = _n_x(service)
    prefill_s = _prefill_cost(n_x, 16)
    # Feasible at admission (Eq. 4a was fitted to single-chunk prefills), too short for
    # this goal's 16-token chunks: the model notices between chunks, before the deadline.
    budget = 0.9 * prefill_s
    assert service.time_model.least_e2e_s(n_x) < budget
    result = Goal(service, clock, GoalRequest(PROMPT, budget_s=budget)).wait()
    assert result.status == status.KILLED and 'can no longer finish' in result.message
    assert result.stop_phase == 'prefill' and result.kill_latency_s < 0
    assert sum(clock.layer_calls) < n_x * N_LAYERS  # the rest of the prefill never ran


def test_kill_in_decode_lands_within_one_layer(make_service, clock):
    service = make_service(coefficients=OPTIMISTIC, n_max=400, stop_bound_s=BIG_BOUND)
    n_x = _n_x(service)
    budget = _prefill_cost(n_x, 64) + 7.3 * STEP_S
    result = Goal(service, clock, GoalRequest(PROMPT, budget_s=budget,
                                              max_new_tokens=400)).wait()
    assert result.status == status.KILLED and result.stop_phase == 'decode'
    assert 0 <= result.kill_latency_s <= _chunk_layer_s(1)
    assert result.response_tokens == 8  # token 1 from the prefill, 7 whole steps


def test_kill_in_decode_comes_before_a_step_that_cannot_finish(make_service, clock):
    service = make_service(n_max=400)
    n_x = _n_x(service)
    result = Goal(service, clock, GoalRequest(PROMPT, budget_s=3 * TRUE.prefill_s(n_x),
                                              max_new_tokens=400)).wait()
    assert result.status == status.KILLED and result.stop_phase == 'decode'
    assert 'can no longer finish' in result.message
    assert -STEP_S < result.kill_latency_s <= 0


def test_kill_during_eviction(make_service, clock):
    service = make_service(coefficients=OPTIMISTIC, stop_bound_s=BIG_BOUND)
    n_x = _n_x(service)
    service.engine.on_evict_layer = lambda: clock.advance(0.04)  # a slow eviction
    service.runner.config = _with_fixed_alpha(service.config, 0.5)  # force an eviction
    budget = _prefill_cost(n_x, 64) + 0.03  # due during the first eviction layer
    result = Goal(service, clock, GoalRequest(PROMPT, budget_s=budget)).wait()
    assert n_x > 64 and result.status == status.KILLED
    assert result.stop_phase == 'eviction' and 0 <= result.kill_latency_s <= 0.04


def _with_fixed_alpha(config, alpha):
    import dataclasses
    from timebill_ros.config import BudgetConfig
    return dataclasses.replace(config, budget=BudgetConfig(mode='fixed', fixed_alpha=alpha))


class SlowPredictor(LengthPredictor):
    """Once the prefill is over, moves the clock past the deadline and blocks until aborted."""

    name = 'slow'

    def __init__(self, clock, advance_s, prefill_done):
        self.clock, self.advance_s, self.prefill_done = clock, advance_s, prefill_done
        self.aborted = threading.Event()

    def predict(self, prompt, input_ids, n_max):
        self.prefill_done.wait(30)
        self.clock.advance(self.advance_s)
        self.aborted.wait(30)
        raise RuntimeError('aborted')

    def abort(self):
        self.aborted.set()


def test_kill_while_waiting_for_the_predictor(make_service, clock):
    prefill_done = threading.Event()
    predictor = SlowPredictor(clock, 10.0, prefill_done)
    service = make_service(coefficients=OPTIMISTIC, predictor=predictor)
    prefill = service.engine.prefill

    def prefill_then_signal(*args, **kwargs):
        state = prefill(*args, **kwargs)
        prefill_done.set()
        return state

    service.engine.prefill = prefill_then_signal
    result = Goal(service, clock, GoalRequest(PROMPT, budget_s=5.0)).wait()
    assert result.status == status.KILLED and result.stop_phase == 'predictor'
    assert predictor.aborted.is_set()


@pytest.mark.parametrize('at_call, phase', [(1, 'prefill'), (2, 'prefill'), (3, 'decode'),
                                            (6, 'decode')])
def test_cancel_lands_before_the_next_layer(make_service, clock, tiny_model, at_call,
                                            phase):
    service = make_service(coefficients=OPTIMISTIC, chunk=512, stop_bound_s=BIG_BOUND)
    holder = {'calls': 0}
    started = threading.Event()

    def cancel_hook(module, args):  # the client cancels while layer call ``at_call`` runs
        holder['calls'] += 1
        if holder['calls'] == at_call:
            service.cancel(holder['goal'].job)

    def hold_until_known(feedback):
        if feedback.phase == status.PHASE_PREFILL:
            started.wait(30)

    handles = [layer.register_forward_pre_hook(cancel_hook) for layer in tiny_model.model.layers]
    try:
        goal = Goal(service, clock, GoalRequest(PROMPT, budget_s=LONG, max_new_tokens=400),
                    on_feedback=hold_until_known)
        holder['goal'] = goal
        started.set()
        result = goal.wait()
    finally:
        for handle in handles:
            handle.remove()
    assert result.status == status.CANCELED and result.stop_phase == phase
    assert len(clock.layer_calls) == at_call  # no layer ran after the cancel


# --- partial ----------------------------------------------------------------------------
def test_partial_backstop_cuts_at_the_deadline_when_the_model_is_wrong(make_service, clock):
    # An optimistic model does not see the deadline coming: the interrupt cuts the step in
    # flight, within one layer after the deadline, and the text so far is returned.
    service = make_service(coefficients=OPTIMISTIC, n_max=400, stop_bound_s=BIG_BOUND)
    n_x = _n_x(service)
    budget = _prefill_cost(n_x, 64) + 10.3 * STEP_S
    result = Goal(service, clock, GoalRequest(PROMPT, budget_s=budget, max_new_tokens=400,
                                              overrun_policy=status.POLICY_PARTIAL)).wait()
    assert result.status == status.COMPLETED and result.truncated and result.response
    assert result.response_tokens == 11
    assert 'truncated after 11 tokens: at the deadline' in result.message
    assert 0 <= result.total_time_s - budget <= _chunk_layer_s(1)


def test_partial_stops_before_a_step_that_cannot_arrive_in_time(make_service, clock):
    service = make_service(n_max=400)
    n_x = _n_x(service)
    result = Goal(service, clock, GoalRequest(
        PROMPT, budget_s=3 * TRUE.prefill_s(n_x), max_new_tokens=400,
        overrun_policy=status.POLICY_PARTIAL)).wait()
    assert result.status == status.COMPLETED and result.truncated and result.deadline_met
    assert 'the next token could not arrive before the deadline' in result.message
    # It stopped only when a whole step no longer fitted.
    assert 0 <= result.budget_s - result.total_time_s < STEP_S


def test_partial_with_no_text_by_the_deadline_ends_killed(make_service, clock):
    service = make_service(coefficients=OPTIMISTIC, chunk=512, stop_bound_s=BIG_BOUND)
    n_x = _n_x(service)
    result = Goal(service, clock, GoalRequest(
        PROMPT, budget_s=0.5 * _prefill_cost(n_x, 512),
        overrun_policy=status.POLICY_PARTIAL)).wait()
    assert result.status == status.KILLED and 'no text yet' in result.message


# --- the time model: WCET, online correction, warm-up, persistence ----------------------
def test_wcet_bounds_the_run_and_composes_its_parts(make_service, clock):
    service = make_service(online=True, chunk=512, stop_bound_s=BIG_BOUND)
    n_x = _n_x(service)
    model = service.time_model
    expected = (model.prefill_s(n_x, 'worst') + model.overhang_s(n_x, 'worst')
                + model.decode_s(n_x, 0.0, 16, 'worst'))
    result = Goal(service, clock, GoalRequest(PROMPT, budget_s=LONG,
                                              max_new_tokens=16)).wait()
    assert result.status == status.COMPLETED and result.eviction_ratio == 0
    assert result.predicted_wcet_s == pytest.approx(expected)
    assert result.execution_time_s <= result.predicted_wcet_s
    assert result.queue_time_s == 0.0


HALF = TimingCoefficients(a=0.0, b=TRUE.b / 2, c=TRUE.c / 2, p=0.0, q=TRUE.q / 2)


def test_the_time_model_learns_a_slower_machine(make_service, clock):
    # Calibrated at half the real cost: the factors become 2, the margins leave the prior.
    service = make_service(coefficients=HALF, online=True, chunk=512, stop_bound_s=BIG_BOUND)
    assert service.status().wcet_margin_decode == pytest.approx(1.3)
    for _ in range(10):
        Goal(service, clock, GoalRequest(PROMPT, budget_s=LONG, max_new_tokens=16)).wait()
    serving = service.status()
    assert serving.speed_factor_decode == pytest.approx(2.0)
    assert serving.speed_factor_prefill == pytest.approx(2.0)
    assert serving.wcet_margin_decode == pytest.approx(1.0)


def test_warm_up_sets_the_speed_factors(make_service, clock):
    service = make_service(coefficients=HALF, online=True, chunk=512)
    service.warm_up()
    for phase in (DECODE, PREFILL):
        assert service.time_model.status(phase).n_samples == 1
        assert service.time_model.status(phase).speed_factor == pytest.approx(2.0)


def _calibration(created):
    return Calibration(
        coefficients=HALF, model_key='tiny', device='cpu', dtype='float32', threads=0,
        prefill_mape_pct=None, decode_mape_pct=None, n_points=0, profiling_s=0.0,
        created=created, method='few_shot', prefill_points=(), decode_points=())


def test_state_is_saved_at_shutdown_and_restored_by_the_factory(make_service, clock,
                                                                tmp_path):
    path = str(tmp_path / 'state.online.yaml')
    calibration = _calibration('2026-11-22T00:00:00+00:00')
    config = ServerConfig(timing=TimingConfig(online=True))
    log = []
    model = build_time_model(config, calibration, FallbackPredictor(), path, log.append)
    assert 'no online state' in log[-1]
    service = make_service(coefficients=model, state_path=path, chunk=512,
                           stop_bound_s=BIG_BOUND)
    for _ in range(3):
        Goal(service, clock, GoalRequest(PROMPT, budget_s=LONG, max_new_tokens=16)).wait()
    learned = model.status(DECODE)
    service.shutdown()
    restored = build_time_model(config, calibration, FallbackPredictor(), path, log.append)
    assert 'restored' in log[-1] and restored.status(DECODE) == learned
    assert learned.speed_factor == pytest.approx(2.0)
    other = build_time_model(config, _calibration('2026-11-23T00:00:00+00:00'),
                             FallbackPredictor(), path, log.append)
    assert 'ignoring' in log[-1] and other.status(DECODE).n_samples == 0


def test_the_fixed_model_ignores_saved_state(tmp_path):
    config = ServerConfig(timing=TimingConfig(online=False))
    log = []
    model = build_time_model(config, _calibration('2026-11-22T00:00:00+00:00'),
                             FallbackPredictor(), str(tmp_path / 'none.yaml'), log.append)
    assert 'fixed' in log[-1] and model.status(DECODE).upper_margin == 1.0


def test_service_accepts_a_time_model(tiny_model, smollm2_tokenizer, clock):
    model = TimeModel(TRUE)
    config = ServerConfig(engine=EngineConfig(max_new_tokens=4))
    engine = LlmEngine(config.engine, config.eviction, model=tiny_model,
                       tokenizer=smollm2_tokenizer, clock=clock)
    service = TimeBillService(config, engine, FallbackPredictor(), model, clock=clock)
    assert service.time_model is model and service.admitter.admission.time_model is model


def test_every_decoding_step_feeds_the_time_model(make_service, clock):
    """The step timer sees the boundary after the last step (EOS / N_max fire there)."""
    service = make_service(chunk=512, stop_bound_s=BIG_BOUND)
    seen = []
    observe = service.time_model.observe_decode
    service.time_model.observe_decode = lambda n_kv, steps, s: (seen.append((steps, s)),
                                                                observe(n_kv, steps, s))
    result = Goal(service, clock, GoalRequest(PROMPT, budget_s=LONG, max_new_tokens=16)).wait()
    assert result.response_tokens == 16
    assert seen[0][0] == 15 and seen[0][1] == pytest.approx(15 * STEP_S)
