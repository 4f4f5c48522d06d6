"""The core service end to end on a tiny random-weight Llama with the real SmolLM2 tokenizer.

Covers: good goals, every kind of bad input, Kill, Skip-Next, cancel (queued, prefill,
decode), queue bound, faults in one goal, shutdown, and exactly one result per goal.
Goals are held in place by blocking inside their feedback callback, so no test depends on
how fast this machine is.
"""

import threading
import time

import pytest

from timebill_ros.server import status
from timebill_ros.config import EngineConfig, QueueConfig, ServerConfig
from timebill_ros.engine import LlmEngine
from timebill_ros.server.goals import GoalRequest
from timebill_ros.predictors import FallbackPredictor, LengthPredictor
from timebill_ros.server.service import TimeBillService
from timebill_ros.timing.model import TimingCoefficients

COEFFS = TimingCoefficients(a=1e-9, b=1e-5, c=1e-3, p=1e-6, q=1e-3)
LONG = 100_000  # seconds: a budget that never runs out in a test


class CountingEngine(LlmEngine):
    """The real engine, counting prefills and optionally failing one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.prefills = 0
        self.fail_next = False

    def prefill(self, input_ids, stop, **kwargs):
        self.prefills += 1
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError('simulated model fault')
        return super().prefill(input_ids, stop, **kwargs)


class Recorder:
    """Collects results and feedback of one goal; can block it at a phase."""

    def __init__(self, block_phase=None, cancel_phase=None):
        self.results = []
        self.feedback = []
        self.done = threading.Event()
        self.block_phase = block_phase
        self.cancel_phase = cancel_phase
        self.release = threading.Event()
        self.blocked = threading.Event()
        self.service = None
        self.job = None
        self.submitted = threading.Event()

    def on_feedback(self, fb):
        self.feedback.append(fb)
        if fb.phase == self.cancel_phase and self.submitted.wait(30):
            self.service.cancel(self.job)
        if fb.phase == self.block_phase and not self.release.is_set():
            self.blocked.set()
            self.release.wait(30)

    def on_done(self, result):
        self.results.append(result)
        self.done.set()

    def wait(self, timeout=60):
        assert self.done.wait(timeout), 'no result'
        return self.results[0]


@pytest.fixture
def make_service(tiny_model, smollm2_tokenizer):
    services = []

    def build(max_depth=4, predictor=None, default_policy='kill', scheduler=None,
              tau_tokens=None, clock=None, budget=None, **engine_kwargs):
        from timebill_ros.config import BudgetConfig, OverrunConfig, SchedulerConfig
        engine_cfg = EngineConfig(max_new_tokens=16, max_model_new_tokens=4096,
                                  prefill_chunk_tokens=64, feedback_every_tokens=1,
                                  **engine_kwargs)
        config = ServerConfig(engine=engine_cfg, queue=QueueConfig(max_depth=max_depth),
                              overrun=OverrunConfig(default_policy=default_policy),
                              scheduler=scheduler or SchedulerConfig(),
                              budget=budget or BudgetConfig())
        timing = {} if clock is None else {'clock': clock}  # injected, or real time
        engine = CountingEngine(engine_cfg, config.eviction, model=tiny_model,
                                tokenizer=smollm2_tokenizer, **timing)
        offload = None
        if tau_tokens is not None:  # a second engine instance on the same tiny model
            from timebill_ros.timing.online import TimeModel
            offload = (CountingEngine(engine_cfg, config.eviction, model=tiny_model,
                                      tokenizer=smollm2_tokenizer), TimeModel(COEFFS))
        service = TimeBillService(config, engine, predictor or FallbackPredictor(), COEFFS,
                                  offload=offload, tau_tokens=tau_tokens, **timing)
        service.start()
        services.append(service)
        return service

    yield build
    for service in services:
        service.shutdown()


def submit(service, request, recorder=None):
    recorder = recorder or Recorder()
    recorder.service = service
    recorder.job = service.submit(request, recorder.on_feedback, recorder.on_done)
    recorder.submitted.set()
    return recorder


def hold_first(service):
    """Submit a first goal and hold it in its decode phase; return its Recorder.

    Goals sent next wait behind it until ``first.release.set()``.
    """
    first = Recorder(block_phase=status.PHASE_DECODE)
    submit(service, GoalRequest('Plan.', budget_s=LONG), first)
    assert first.blocked.wait(30)
    return first


def test_good_goal_completes_with_all_fields(make_service):
    service = make_service()
    result = submit(service, GoalRequest('Plan a path to the dock.', budget_s=LONG)).wait()
    assert result.status == status.COMPLETED, result.message
    assert result.deadline_met and 0 < result.response_tokens <= 16
    assert result.prompt_tokens > 10 and result.predicted_tokens == 16
    assert result.pessimistic_tokens == 16 and result.predictor == 'fallback'
    assert result.eviction_ratio == 0.0 and result.predicted_wcet_s > 0
    assert result.total_time_s >= result.prefill_time_s > 0
    rec = submit(service, GoalRequest('Hi', budget_s=LONG))
    rec.wait()
    phases = [f.phase for f in rec.feedback]
    assert phases[:3] == [status.PHASE_QUEUED, status.PHASE_PREFILL, status.PHASE_DECODE]
    assert sum(f.tokens_generated > 0 for f in rec.feedback) >= 1


E = status  # the error codes: one per cause
BAD = [
    (GoalRequest('   ', budget_s=5.0), 'empty', E.ERROR_INVALID_PROMPT),
    (GoalRequest('x', budget_s=float('nan')), 'finite', E.ERROR_INVALID_TIMING),
    (GoalRequest('x', budget_s=float('inf')), 'finite', E.ERROR_INVALID_TIMING),
    (GoalRequest('x', budget_s=0.0), '> 0', E.ERROR_INVALID_TIMING),
    (GoalRequest('x'), 'both are zero', E.ERROR_INVALID_TIMING),
    (GoalRequest('x', budget_s=-2.0), '> 0', E.ERROR_INVALID_TIMING),
    (GoalRequest('x', deadline_s=1.0), 'already past', E.ERROR_INVALID_TIMING),
    (GoalRequest('x', budget_s=5.0, max_new_tokens=10**6), 'model capacity',
     E.ERROR_INVALID_OPTION),
    (GoalRequest('x', budget_s=5.0, overrun_policy=9), 'unknown overrun_policy',
     E.ERROR_INVALID_OPTION),
    (GoalRequest('x', budget_s=5.0, top_p=1.5), 'top_p', E.ERROR_INVALID_OPTION),
    (GoalRequest('x', budget_s=5.0, stop=('',)), 'stop[0]', E.ERROR_INVALID_OPTION),
    (GoalRequest('x', budget_s=5.0, messages=(('robot', 'hi'),)), 'messages[0].role',
     E.ERROR_INVALID_PROMPT),
    (GoalRequest('x', budget_s=5.0, json_schema='{not json'), 'json_schema',
     E.ERROR_INVALID_SCHEMA),
    (GoalRequest('word ' * 5000, budget_s=5.0), 'model context', E.ERROR_CONTEXT_OVERFLOW),
    (GoalRequest('x' * 65000, system_prompt='y' * 1000, budget_s=5.0), 'prompt too large',
     E.ERROR_PROMPT_TOO_LARGE),
    (GoalRequest('x', budget_s=5.0, json_schema='{"type": "object"}' + ' ' * 20000),
     'json_schema too large: 20018 characters, queue.max_schema_chars=16384',
     E.ERROR_INVALID_SCHEMA),
]


@pytest.mark.parametrize('request_, cause, code', BAD, ids=[c for _, c, _ in BAD])
def test_bad_input_is_rejected_without_running_the_model(make_service, request_, cause, code):
    service = make_service()
    rec = submit(service, request_)
    result = rec.wait()
    assert rec.job is None
    assert result.status == status.REJECTED and cause in result.message
    assert result.error_code == code
    assert service.engine.prefills == 0
    good = submit(service, GoalRequest('Say hi.', budget_s=LONG)).wait()
    assert good.status == status.COMPLETED


def test_kill_stops_at_the_deadline(make_service):
    service = make_service()
    result = submit(service, GoalRequest('Tell a long story.', budget_s=0.3,
                                         max_new_tokens=4000)).wait()
    assert result.status == status.KILLED, result.message
    assert result.error_code == status.ERROR_DEADLINE
    assert result.response == '' and not result.deadline_met
    # Stopped at the deadline, or just before it when the next step could not finish in
    # time (exact bounds: test_deadlines.py, on a deterministic clock).
    assert result.kill_latency_s is not None and result.stop_phase == 'decode'
    # 4000 tokens cannot fit 0.3 s at any alpha: a kill goal's late answer is lost, so it
    # takes its best chance, the paper's clamp to alpha_max (budget.keep_cache_when_hopeless
    # is for goals whose answer still arrives: the tests below).
    assert result.eviction_ratio == service.config.budget.alpha_max


def test_a_hopeless_skip_next_goal_takes_the_clamp(make_service):
    """Its late answer would make the goals after it skip: it takes its best chance too."""
    service = make_service()
    result = submit(service, GoalRequest('Tell a long story.', budget_s=0.05,
                                         max_new_tokens=400, overrun_policy=2)).wait()
    assert result.status == status.COMPLETED and not result.deadline_met
    assert result.eviction_ratio == service.config.budget.alpha_max


def test_a_hopeless_partial_goal_keeps_its_cache(make_service):
    """Its cut answer arrives at the deadline: eviction would cost quality for no deadline."""
    service = make_service()
    result = submit(service, GoalRequest('Tell a long story.', budget_s=0.4,
                                         max_new_tokens=4000, overrun_policy=3)).wait()
    assert result.status == status.COMPLETED and result.truncated, result.message
    assert result.eviction_ratio == 0.0


def test_skip_next_finishes_late_and_skips_goals_due_meanwhile(make_service):
    service = make_service()
    first = Recorder(block_phase=status.PHASE_DECODE)
    submit(service, GoalRequest('Plan.', budget_s=0.2, max_new_tokens=8, overrun_policy=2),
           first)
    assert first.blocked.wait(30)
    second = submit(service, GoalRequest('Yes or no?', budget_s=0.3, overrun_policy=1))
    skipped = second.wait()
    first.release.set()
    late = first.wait()
    assert skipped.status == status.SKIPPED and 'overran' in skipped.message
    assert skipped.error_code == status.ERROR_SKIPPED_OVERRUN
    assert late.status == status.COMPLETED and not late.deadline_met
    assert late.error_code == status.ERROR_NONE
    assert late.response_tokens > 0


def test_queued_kill_goal_is_rejected_once_it_can_no_longer_fit(make_service):
    """A Kill goal waiting behind another ends REJECTED (infeasible) before its deadline."""
    service = make_service()
    first = hold_first(service)
    rec = submit(service, GoalRequest('Quick?', budget_s=0.2))
    expired = rec.wait()
    first.release.set()
    assert expired.status == status.REJECTED and expired.infeasible
    assert expired.error_code == status.ERROR_INFEASIBLE
    assert 'queued' in expired.message and 'needs at least' in expired.message
    assert expired.total_time_s < 0.2 and expired.min_time_s > 0
    assert first.wait().status == status.COMPLETED


def test_queued_skip_next_goal_expires_killed_when_nothing_overruns(make_service):
    service = make_service()
    first = hold_first(service)
    expired = submit(service, GoalRequest('Quick?', budget_s=0.2, overrun_policy=2)).wait()
    first.release.set()
    assert expired.status == status.KILLED and 'while queued' in expired.message
    assert expired.error_code == status.ERROR_DEADLINE
    assert first.wait().status == status.COMPLETED


@pytest.mark.parametrize('phase, where', [(status.PHASE_PREFILL, 'prefill'),
                                          (status.PHASE_DECODE, 'decode')])
def test_cancel_while_running(make_service, phase, where):
    service = make_service()
    rec = submit(service, GoalRequest('Explain.', budget_s=LONG),
                 Recorder(cancel_phase=phase))
    # The cancel is sent from the first feedback of the phase, before the engine checks.
    result = rec.wait()
    assert result.status == status.CANCELED and where in result.message
    assert result.error_code == status.ERROR_NONE


def test_cancel_before_start(make_service):
    service = make_service()
    first = hold_first(service)
    queued = submit(service, GoalRequest('Later.', budget_s=LONG))
    service.cancel(queued.job)
    result = queued.wait()
    first.release.set()
    assert result.status == status.CANCELED and 'queued' in result.message
    assert first.wait().status == status.COMPLETED
    assert service.engine.prefills == 1


def test_flood_beyond_queue_bound_is_rejected(make_service):
    service = make_service(max_depth=2)
    first = hold_first(service)
    flood = [submit(service, GoalRequest(f'Goal {i}', budget_s=LONG)) for i in range(6)]
    rejected = [r for r in flood if r.done.is_set()]
    assert len(rejected) == 4
    assert all(r.results[0].status == status.REJECTED and 'queue full' in r.results[0].message
               and r.results[0].error_code == status.ERROR_QUEUE_FULL for r in rejected)
    first.release.set()
    assert all(r.wait().status == status.COMPLETED for r in flood if r.job is not None)


class BrokenPredictor(LengthPredictor):
    name = 'broken'

    def predict(self, prompt, input_ids, n_max):
        raise RuntimeError('predictor exploded')


def test_faults_end_one_goal_and_the_next_succeeds(make_service):
    service = make_service(predictor=BrokenPredictor())
    ok = submit(service, GoalRequest('Hi.', budget_s=LONG)).wait()
    assert ok.status == status.COMPLETED and 'predictor exploded' in ok.predictor
    assert ok.predicted_tokens == 16
    service.engine.fail_next = True
    failed = submit(service, GoalRequest('Hi.', budget_s=LONG)).wait()
    assert failed.status == status.FAILED and 'simulated model fault' in failed.message
    assert failed.error_code == status.ERROR_INTERNAL
    again = submit(service, GoalRequest('Hi again.', budget_s=LONG)).wait()
    assert again.status == status.COMPLETED


def test_shutdown_ends_goals_in_flight_exactly_once(make_service):
    service = make_service()
    running = Recorder(block_phase=status.PHASE_DECODE)
    submit(service, GoalRequest('Plan.', budget_s=LONG), running)
    assert running.blocked.wait(30)
    queued = [submit(service, GoalRequest(f'Q{i}', budget_s=LONG)) for i in range(3)]
    closer = threading.Thread(target=service.shutdown)
    closer.start()
    for rec in queued:
        assert rec.wait().status == status.FAILED
        assert rec.results[0].error_code == status.ERROR_SHUTDOWN
    running.release.set()
    closer.join(30)
    assert not closer.is_alive()
    assert running.wait().status == status.FAILED
    assert 'shut down' in running.results[0].message
    assert running.results[0].error_code == status.ERROR_SHUTDOWN
    for rec in queued + [running]:
        assert len(rec.results) == 1
    late = submit(service, GoalRequest('After.', budget_s=LONG)).wait()
    assert late.status == status.REJECTED and 'shutting down' in late.message
    assert late.error_code == status.ERROR_SHUTDOWN


def test_a_paused_service_refuses_new_goals_and_finishes_the_others(make_service):
    """What the node's deactivate does: INACTIVE for new goals; queued and running go on."""
    service = make_service()
    running = Recorder(block_phase=status.PHASE_DECODE)
    submit(service, GoalRequest('Plan.', budget_s=LONG), running)
    assert running.blocked.wait(30)
    queued = submit(service, GoalRequest('Queued before the pause.', budget_s=LONG))
    service.pause()
    assert not service.accepting
    refused = submit(service, GoalRequest('While paused.', budget_s=LONG)).wait()
    assert refused.status == status.REJECTED and refused.error_code == status.ERROR_INACTIVE
    assert 'inactive' in refused.message
    running.release.set()
    assert running.wait().status == status.COMPLETED
    assert queued.wait().status == status.COMPLETED
    service.resume()
    assert submit(service, GoalRequest('Again.', budget_s=LONG)).wait().status == \
        status.COMPLETED


def test_fifo_follows_receipt_time_not_queue_arrival(make_service):
    service = make_service()
    first = hold_first(service)
    now = service.clock()
    order = []
    late, early = Recorder(), Recorder()
    late.on_done = lambda r, rec=late: (order.append('late'), Recorder.on_done(rec, r))
    early.on_done = lambda r, rec=early: (order.append('early'), Recorder.on_done(rec, r))
    for rec, received in ((late, now), (early, now - 0.5)):
        rec.service = service
        rec.job = service.submit(GoalRequest('Hi.', budget_s=LONG), rec.on_feedback,
                                 rec.on_done, received_s=received)
    first.release.set()
    assert late.wait().status == early.wait().status == status.COMPLETED
    assert order == ['early', 'late']


class PromptLengthPredictor(LengthPredictor):
    """Predicts the number in the prompt ("Count to 12." -> 12 tokens); records its calls."""

    name = 'by-prompt'

    def __init__(self, delay_s=0.0):
        self.calls = []
        self.delay_s = delay_s

    def predict(self, prompt, input_ids, n_max):
        self.calls.append(prompt)
        time.sleep(self.delay_s)
        return min(n_max, int(''.join(c for c in prompt if c.isdigit()) or 0))


def _run_in_order(service, prompts):
    """Hold the executor on a first goal, queue ``prompts``, release; return the run order."""
    first = hold_first(service)
    order, recorders = [], []
    for prompt in prompts:
        rec = Recorder()
        rec.on_done = lambda r, rec=rec, p=prompt: (order.append(p), Recorder.on_done(rec, r))
        recorders.append(submit(service, GoalRequest(prompt, budget_s=LONG), rec))
    for job in (rec.job for rec in recorders):
        job.prediction.result(timeout=30)  # u_J known before the executor chooses
        # result() can return before the future's done-callback has recorded u_J on the job.
        deadline = time.monotonic() + 30
        while job.predicted_tokens is None and time.monotonic() < deadline:
            time.sleep(0.001)
    first.release.set()
    results = [rec.wait() for rec in recorders]
    assert first.wait().uncertainty_tokens == 0  # it started without waiting
    return order, results


def test_luf_runs_the_shortest_predicted_answer_first_and_reuses_u_j(make_service):
    from timebill_ros.config import SchedulerConfig
    predictor = PromptLengthPredictor(delay_s=0.05)
    service = make_service(predictor=predictor, scheduler=SchedulerConfig(policy='luf'))
    order, results = _run_in_order(service, ['Count to 14.', 'Count to 3.', 'Count to 9.'])
    assert order == ['Count to 3.', 'Count to 9.', 'Count to 14.']
    for prompt, result in zip(['Count to 14.', 'Count to 3.', 'Count to 9.'], results):
        assert result.status == status.COMPLETED, result.message
        assert result.predictor == 'by-prompt (at admission)'
        assert result.uncertainty_tokens == result.predicted_tokens == int(prompt[9:-1])
        assert result.executor == 'primary'
        # The admission prediction is the goal's t_Predict, not scheduling overhead.
        assert result.schedule_time_s < 0.05 <= result.predict_time_s
    # u_J was predicted once per queued goal, and reused as N^ when it ran.
    assert sorted(predictor.calls) == sorted(['Plan.', 'Count to 14.', 'Count to 3.',
                                              'Count to 9.'])


def test_u_j_is_predicted_at_admission_only_when_something_reads_it(make_service):
    """Not under fifo / edf with a prefill readout: nothing there reads u_J.

    Predicting it would only take the CPU from the goal running meanwhile (the RLP over a
    long prompt, docs/benchmark.md).
    """
    from timebill_ros.config import SchedulerConfig
    predictor = PromptLengthPredictor()
    service = make_service(predictor=predictor)  # fifo
    service.uncertainty.readout = object()  # u_J's choice only; the runner keeps its own
    first = Recorder(block_phase=status.PHASE_DECODE)
    submit(service, GoalRequest('Plan.', budget_s=LONG), first)
    assert first.blocked.wait(30)
    queued = submit(service, GoalRequest('Count to 3.', budget_s=LONG))
    assert queued.job.prediction is None
    first.release.set()
    assert queued.wait().uncertainty_tokens == 0
    assert not service.uncertainty.wanted(offloading=False)
    assert service.uncertainty.wanted(offloading=True)  # the offload route reads u_J
    service.uncertainty.readout = None  # without a readout the run reuses u_J as its N^
    assert service.uncertainty.wanted(offloading=False)
    for policy, reads in (('edf', False), ('luf', True), ('muf', True), ('slack', True),
                          ('up', True)):
        other = make_service(predictor=predictor, scheduler=SchedulerConfig(policy=policy))
        other.uncertainty.readout = object()
        assert other.uncertainty.wanted(offloading=False) is reads, policy


def test_muf_and_uncertainty_none(make_service):
    from timebill_ros.config import SchedulerConfig
    service = make_service(predictor=PromptLengthPredictor(),
                           scheduler=SchedulerConfig(policy='muf'))
    order, _ = _run_in_order(service, ['Count to 3.', 'Count to 14.', 'Count to 9.'])
    assert order == ['Count to 14.', 'Count to 9.', 'Count to 3.']
    blind = make_service(predictor=PromptLengthPredictor(),
                         scheduler=SchedulerConfig(policy='luf', uncertainty='none'))
    first = Recorder(block_phase=status.PHASE_DECODE)
    submit(blind, GoalRequest('Plan.', budget_s=LONG), first)
    assert first.blocked.wait(30)
    queued = submit(blind, GoalRequest('Count to 3.', budget_s=LONG))
    assert queued.job.prediction is None and queued.job.uncertainty_tokens == 16
    first.release.set()
    result = queued.wait()
    assert result.predictor == 'by-prompt' and result.uncertainty_tokens == 0


def test_offload_takes_goals_above_tau_and_work_when_the_primary_is_busy(make_service):
    from timebill_ros.config import SchedulerConfig
    service = make_service(predictor=PromptLengthPredictor(), tau_tokens=8,
                           scheduler=SchedulerConfig(policy='up'))
    first = Recorder(block_phase=status.PHASE_DECODE)
    submit(service, GoalRequest('Plan 1.', budget_s=LONG), first)  # u unknown -> primary
    assert first.blocked.wait(30)
    assert service.status().executors[0][:2] == ('primary', True)
    long_rec = submit(service, GoalRequest('Count to 14.', budget_s=LONG))
    short_rec = submit(service, GoalRequest('Count to 3.', budget_s=LONG))
    long_result, short_result = long_rec.wait(), short_rec.wait()
    # u_J = 14 > tau: the offload executor's own goal. u_J = 3 belongs to the primary, but
    # the primary is held: the idle offload executor takes it rather than wait.
    assert long_result.executor == 'offload' and long_result.uncertainty_tokens == 14
    assert short_result.executor == 'offload' and short_result.uncertainty_tokens == 3
    assert long_result.status == short_result.status == status.COMPLETED
    assert service.engine.prefills == 1  # the primary ran only the held goal so far
    first.release.set()
    assert first.wait().executor == 'primary'
    # Both idle: a goal whose u_J is unknown (it did not wait) runs on the primary.
    again = submit(service, GoalRequest('Count to 2.', budget_s=LONG)).wait()
    assert again.executor == 'primary' and again.status == status.COMPLETED
    assert [name for name, _, _ in service.status().executors] == ['primary', 'offload']


def test_an_offload_executor_attached_while_serving_takes_its_goals(
        make_service, tiny_model, smollm2_tokenizer):
    """What the factory does beside a GPU primary: the offload engine comes after the start."""
    from timebill_ros.config import SchedulerConfig
    from timebill_ros.timing.online import TimeModel
    service = make_service(predictor=PromptLengthPredictor(),
                           scheduler=SchedulerConfig(policy='up'))
    before = submit(service, GoalRequest('Count to 14.', budget_s=LONG)).wait()
    assert before.executor == 'primary'  # no offload executor yet: everything runs here
    engine = CountingEngine(service.config.engine, service.config.eviction, model=tiny_model,
                            tokenizer=smollm2_tokenizer)
    assert service.attach_offload((engine, TimeModel(COEFFS)), 8)
    assert not service.attach_offload((engine, TimeModel(COEFFS)), 8)  # one offload executor
    first = Recorder(block_phase=status.PHASE_DECODE)
    submit(service, GoalRequest('Plan 1.', budget_s=LONG), first)
    assert first.blocked.wait(30)
    after = submit(service, GoalRequest('Count to 14.', budget_s=LONG)).wait()
    first.release.set()
    assert after.executor == 'offload' and after.status == status.COMPLETED
    assert first.wait().executor == 'primary' and service.healthy
    service.shutdown()
    assert not service.attach_offload((engine, TimeModel(COEFFS)), 8)  # nothing after shutdown
    with pytest.raises(ValueError, match='tau_tokens'):
        service.attach_offload((engine, TimeModel(COEFFS)), None)


def test_offload_route_counts_the_top_bucket_when_tau_sits_at_the_cap(make_service):
    import types
    service = make_service(tau_tokens=16)  # N_max = 16: tau at the predictor's cap
    for u_j, n_max, where in ((16, 16, 'offload'), (15, 16, 'primary'), (None, 16, 'primary'),
                              (16, 64, 'primary'), (17, 64, 'offload')):
        job = types.SimpleNamespace(predicted_tokens=u_j, n_max=n_max)
        assert service.dispatcher.route(job) == where, (u_j, n_max)
    alone = make_service().dispatcher
    assert alone.route(types.SimpleNamespace(predicted_tokens=99, n_max=16)) == \
        'primary'  # no offload executor


def test_goals_ended_in_the_queue_report_their_queue_time(make_service):
    service = make_service()
    first = hold_first(service)
    queued = submit(service, GoalRequest('Hi.', budget_s=LONG))
    service.cancel(queued.job)
    result = queued.wait()
    first.release.set()
    assert result.status == status.CANCELED
    assert result.queue_time_s == result.total_time_s > 0
    assert result.schedule_time_s >= 0 and first.wait().schedule_time_s > 0


def test_offload_needs_tau(tiny_model, smollm2_tokenizer):
    config = ServerConfig(engine=EngineConfig(max_new_tokens=16))
    engine = LlmEngine(config.engine, config.eviction, model=tiny_model,
                       tokenizer=smollm2_tokenizer)
    with pytest.raises(ValueError, match='tau_tokens'):
        TimeBillService(config, engine, FallbackPredictor(), COEFFS,
                        offload=(engine, None))


def test_stats_status_names_the_policy_and_the_executors(make_service):
    from timebill_ros.config import SchedulerConfig
    service = make_service(scheduler=SchedulerConfig(policy='up'))
    serving = service.status()
    assert serving.scheduler_policy == 'up'
    assert serving.executors == (('primary', False, 0),)


# --- failure isolation: a fault in a callback ends at most its own goal ------------------
def _capture_logs(service):
    lines = []
    service.log = service.dispatcher.log = lines.append
    for executor in service.executors:
        executor.log = lines.append
    return lines


def test_a_raising_on_done_leaves_the_executor_serving(make_service):
    service = make_service()
    lines = _capture_logs(service)
    seen = []

    def broken_on_done(result):
        seen.append(result)
        raise RuntimeError('on_done exploded')

    service.submit(GoalRequest('Hi.', budget_s=LONG), lambda fb: None, broken_on_done)
    assert submit(service, GoalRequest('Next.', budget_s=LONG)).wait().status == \
        status.COMPLETED
    assert len(seen) == 1 and seen[0].status == status.COMPLETED
    assert any('on_done exploded' in line for line in lines)
    assert service.healthy


def test_a_raising_stats_record_still_delivers_the_result(make_service):
    service = make_service()
    lines = _capture_logs(service)

    def broken_record(result):
        raise ValueError('stats exploded')

    service.stats.record = broken_record
    assert submit(service, GoalRequest('Hi.', budget_s=LONG)).wait().status == \
        status.COMPLETED
    rejected = submit(service, GoalRequest('   ', budget_s=LONG)).wait()
    assert rejected.status == status.REJECTED
    assert sum('stats exploded' in line for line in lines) == 2
    assert service.healthy


def test_a_raising_feedback_callback_fails_only_its_goal(make_service):
    service = make_service()
    _capture_logs(service)
    rec = Recorder()

    def broken_feedback(fb):
        if fb.phase == status.PHASE_DECODE:
            raise RuntimeError('feedback exploded')

    rec.service = service
    service.submit(GoalRequest('Hi.', budget_s=LONG), broken_feedback, rec.on_done)
    failed = rec.wait()
    assert failed.status == status.FAILED and 'feedback exploded' in failed.message
    assert submit(service, GoalRequest('Next.', budget_s=LONG)).wait().status == \
        status.COMPLETED


def test_the_reaper_and_the_executor_outlive_faults_of_their_own(make_service):
    service = make_service()
    lines = _capture_logs(service)
    first = hold_first(service)
    real_expired, real_select = service.queue.expired, service.queue.policy.select
    faults = {'reaper': 0, 'select': 0}

    def expired_once(now_s):
        if not faults['reaper']:
            faults['reaper'] += 1
            raise RuntimeError('reaper exploded')
        return real_expired(now_s)

    def select_once(jobs, now_s):
        if not faults['select']:
            faults['select'] += 1
            raise RuntimeError('select exploded')
        return real_select(jobs, now_s)

    service.queue.expired = expired_once
    service.queue.policy.select = select_once
    queued = submit(service, GoalRequest('Quick?', budget_s=0.3))  # comes due in the queue
    assert queued.wait().status == status.REJECTED  # the reaper's second round ended it
    waiting = submit(service, GoalRequest('Then this.', budget_s=LONG))
    first.release.set()
    assert first.wait().status == status.COMPLETED
    assert waiting.wait().status == status.COMPLETED  # taken after the failed select
    assert faults == {'reaper': 1, 'select': 1}
    assert any('reaper exploded' in line for line in lines)
    assert any('select exploded' in line for line in lines)
    assert service.healthy


def _consolidating(make_service, **kwargs):
    from timebill_ros.config import SchedulerConfig
    return make_service(predictor=PromptLengthPredictor(), decode_weights='float32',
                        scheduler=SchedulerConfig(policy='fifo', consolidation=True,
                                                  batch_size=4), **kwargs)


def test_consolidation_batches_goals_of_similar_length_with_the_answers_they_get_alone(
        make_service):
    prompts = ['Count to 5.', 'Count to 6.', 'Count to 14.']
    service = _consolidating(make_service)
    order, results = _run_in_order(service, prompts)
    # u_J 5 and 6 are within lambda = 1.5 of each other: one batch; 14 is not: alone.
    assert [r.batch_size for r in results] == [2, 2, 1]
    assert service.runner.batch_scale.learned[2] > 0  # the batch's steps were measured
    assert order[2] == 'Count to 14.'
    for result in results:
        assert result.status == status.COMPLETED, result.message
        assert result.eviction_ratio == 0.0 and result.response_tokens > 0
    alone = make_service(predictor=PromptLengthPredictor(), decode_weights='float32')
    for prompt, batched in zip(prompts, results):
        single = submit(alone, GoalRequest(prompt, budget_s=LONG)).wait()
        assert single.batch_size == 1
        assert (single.response, single.response_tokens) == \
            (batched.response, batched.response_tokens)  # fp32, alpha* = 0: identical


def test_consolidation_leaves_out_a_goal_the_batch_would_make_late(make_service):
    from timebill_ros.server import overrun
    from timebill_ros.server.job import Job
    service = _consolidating(make_service)
    model = service.time_model

    def job(tokens, budget_s):
        return Job(GoalRequest('x'), 'g', 0.0, budget_s, overrun.policy_by_name('kill'), 16,
                   [1] * 100, lambda fb: None, lambda r: None, predicted_tokens=tokens)

    # Without a batched-step fit a goal's step in a batch of 2 is 2x: a goal whose budget
    # holds its prefill and decoding alone, but not twice the decoding, is left out.
    alone_s = model.prefill_s(100) + model.decode_s(100, 0.0, 10)
    tight, easy = job(10, 1.01 * alone_s), job(10, 100.0)
    assert service.dispatcher.cut([tight, easy], 0.0) == [0]
    roomy = job(10, 100.0)
    assert service.dispatcher.cut([roomy, easy], 0.0) == [0, 1]


def _batch_of_two(service, second):
    """Hold the executor, queue a goal and ``second`` (a Recorder) of similar u_J, release."""
    first = hold_first(service)
    other = submit(service, GoalRequest('Count to 6.', budget_s=LONG))
    return first, other


def test_a_goal_canceled_mid_batch_leaves_it_and_the_other_completes(make_service):
    service = _consolidating(make_service)
    first, other = _batch_of_two(service, None)
    leaving = submit(service, GoalRequest('Count to 5.', budget_s=LONG),
                     Recorder(cancel_phase=status.PHASE_DECODE))
    for rec in (other, leaving):
        rec.job.prediction.result(timeout=30)
    first.release.set()
    canceled, completed = leaving.wait(), other.wait()
    assert canceled.status == status.CANCELED and canceled.message == 'canceled during decode'
    assert completed.status == status.COMPLETED, completed.message
    assert canceled.batch_size == completed.batch_size == 2
    assert first.wait().status == status.COMPLETED


class ManualClock:
    """Service seconds that move only when a test advances them."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


def test_a_goal_that_comes_due_mid_batch_is_killed_and_the_other_completes(make_service):
    clock = ManualClock()  # injected: nothing comes due unless the test moves time
    service = _consolidating(make_service, clock=clock)
    first, other = _batch_of_two(service, None)
    due = submit(service, GoalRequest('Count to 5.', budget_s=2.0),
                 Recorder(block_phase=status.PHASE_DECODE))
    for rec in (other, due):
        rec.job.prediction.result(timeout=30)
    first.release.set()
    # The due goal is held as it joins the batch until its deadline has passed.
    assert due.blocked.wait(30)
    clock.advance(due.job.deadline_s - clock() + 0.05)
    due.release.set()
    killed, completed = due.wait(), other.wait()
    assert killed.status == status.KILLED and killed.stop_phase == 'decode', killed.message
    assert completed.status == status.COMPLETED, completed.message
    assert killed.batch_size == completed.batch_size == 2


def test_goals_routed_to_the_offload_executor_never_join_a_batch(make_service):
    service = _consolidating(make_service, tau_tokens=8)
    # Both executors held: the primary by a first goal, the offload one by a long goal.
    first = hold_first(service)
    held = submit(service, GoalRequest('Count to 15.', budget_s=LONG),
                  Recorder(block_phase=status.PHASE_DECODE))
    held.job.prediction.result(timeout=30)
    assert held.blocked.wait(30)
    recs = [submit(service, GoalRequest(p, budget_s=LONG))
            for p in ('Count to 12.', 'Count to 13.', 'Count to 3.', 'Count to 4.')]
    for rec in recs:
        rec.job.prediction.result(timeout=30)
    first.release.set()
    results = [rec.wait() for rec in recs]
    held.release.set()
    for result in results:
        assert result.status == status.COMPLETED, result.message
    # 12 and 13 are offload goals (u_J > tau = 8): the primary takes them (the offload
    # executor is busy) but one at a time; 3 and 4 are the primary's own: one batch.
    assert [r.batch_size for r in results] == [1, 1, 2, 2]
    assert held.wait().status == status.COMPLETED


@pytest.mark.parametrize('checkpoint_tokens', [0, 4])
def test_continuous_batching_lets_waiting_goals_join_between_steps(make_service,
                                                                   checkpoint_tokens):
    """Waiting goals join between steps; with checkpoints (4) each row re-decides on its own.

    On a roomy budget the checkpoints evict nothing: the answers are those of a goal alone.
    """
    from timebill_ros.config import BudgetConfig, SchedulerConfig
    service = make_service(predictor=PromptLengthPredictor(), decode_weights='float32',
                           scheduler=SchedulerConfig(continuous=True, batch_size=4),
                           budget=BudgetConfig(checkpoint_tokens=checkpoint_tokens))
    prompts = ['Count to 5.', 'Count to 14.']
    order, results = _run_in_order(service, prompts)
    # fifo + continuous batching: any waiting goal joins the running one (no length cut).
    assert [r.batch_size for r in results] == [3, 3]
    alone = make_service(predictor=PromptLengthPredictor(), decode_weights='float32')
    for prompt, batched in zip(prompts, results):
        assert batched.status == status.COMPLETED, batched.message
        assert bool(batched.checkpoint_tokens) == bool(checkpoint_tokens)
        assert set(batched.checkpoint_ratios) <= {0.0}
        single = submit(alone, GoalRequest(prompt, budget_s=LONG)).wait()
        assert single.response == batched.response  # fp32, alpha* = 0: identical


def test_continuous_batching_with_consolidation_admits_only_similar_lengths(make_service):
    from timebill_ros.config import SchedulerConfig
    service = make_service(predictor=PromptLengthPredictor(), decode_weights='float32',
                           scheduler=SchedulerConfig(consolidation=True, continuous=True,
                                                     batch_size=4))
    # The held goal started without waiting: its u_J is N_max = 16. 12 joins it (16 / 12
    # < 1.5); 3 does not and runs once the batch is done.
    order, results = _run_in_order(service, ['Count to 12.', 'Count to 3.'])
    assert [r.batch_size for r in results] == [2, 1]
    assert order == ['Count to 12.', 'Count to 3.']


class _RaisingFeedback(Recorder):
    """A client whose feedback callback raises on the QUEUED feedback."""

    def on_feedback(self, fb):
        self.feedback.append(fb)
        if fb.phase == status.PHASE_QUEUED:
            raise RuntimeError('feedback publisher gone')


def test_a_prediction_that_cannot_start_leaves_the_queued_goal_running(make_service,
                                                                       monkeypatch):
    """Logged; the goal keeps its place and completes, with u_J = N_max.

    (It raised out of submit once the goal was queued: the goal ran on, and the client got
    an empty result.)
    """
    service = make_service(predictor=PromptLengthPredictor())
    first = hold_first(service)

    def refuse(*args, **kwargs):
        raise RuntimeError('cannot schedule new futures after shutdown')
    monkeypatch.setattr(service.uncertainty.thread, 'submit', refuse)
    rec = submit(service, GoalRequest('Count to 3.', budget_s=LONG))
    assert rec.job is not None and rec.job.prediction is None
    first.release.set()
    result = rec.wait()
    assert result.status == status.COMPLETED, result.message
    assert len(rec.results) == 1 and rec.feedback[0].phase == status.PHASE_QUEUED
    assert first.wait().status == status.COMPLETED


def test_a_raising_queued_feedback_fails_its_goal_once(make_service):
    """As a raising feedback callback does while the goal runs (it raised out of submit)."""
    service = make_service()
    first = hold_first(service)
    rec = submit(service, GoalRequest('Count to 3.', budget_s=LONG), _RaisingFeedback())
    result = rec.wait()
    assert rec.job is not None and len(rec.results) == 1
    assert result.status == status.FAILED and result.error_code == status.ERROR_INTERNAL
    assert 'feedback failed: RuntimeError: feedback publisher gone' in result.message
    assert service.queue_depth == 0
    first.release.set()
    assert first.wait().status == status.COMPLETED
    assert submit(service, GoalRequest('Next.', budget_s=LONG)).wait().status == \
        status.COMPLETED


def test_an_admission_fault_ends_the_goal_failed_once(make_service, monkeypatch):
    service = make_service()

    def broken(*args, **kwargs):
        raise KeyError('tokenizer table')
    monkeypatch.setattr(service.admitter.admission, 'check', broken)
    rec = submit(service, GoalRequest('Say hi.', budget_s=LONG))
    result = rec.wait()
    assert rec.job is None and len(rec.results) == 1
    assert result.status == status.FAILED and result.error_code == status.ERROR_INTERNAL
    assert "internal error at admission: KeyError: 'tokenizer table'" in result.message
    assert service.idle
    monkeypatch.undo()
    assert submit(service, GoalRequest('Say hi.', budget_s=LONG)).wait().status == \
        status.COMPLETED


def test_a_full_queue_refuses_a_schema_goal_before_compiling_it(make_service, monkeypatch):
    service = make_service(max_depth=1)
    first = hold_first(service)
    waiting = submit(service, GoalRequest('Say hi.', budget_s=LONG))
    compiled = []
    monkeypatch.setattr(service.engine, '_schemas', _Recording(compiled))  # engine.schemas
    full = submit(service, GoalRequest('x', budget_s=LONG, json_schema='{"type": "object"}'))
    result = full.wait()
    assert result.status == status.REJECTED and result.error_code == status.ERROR_QUEUE_FULL
    assert compiled == []
    first.release.set()
    assert waiting.wait().status == status.COMPLETED


class _Recording:
    """A schema compiler that records what it was asked to compile."""

    def __init__(self, calls):
        self.calls = calls

    def compile(self, text, timeout_s=None):
        self.calls.append(text)
        raise ValueError('not compiled in this test')


def test_checkpoints_are_on_the_result(make_service):
    """budget.checkpoint_tokens = 4: a re-decision at tokens 5, 9 and 13 of 16, on record."""
    from timebill_ros.config import BudgetConfig
    service = make_service(budget=BudgetConfig(checkpoint_tokens=4))
    result = submit(service, GoalRequest('Plan a path to the dock.', budget_s=LONG)).wait()
    assert result.status == status.COMPLETED, result.message
    assert result.response_tokens == 16
    assert result.checkpoint_tokens == (5, 9, 13)
    assert result.checkpoint_ratios == (0.0, 0.0, 0.0) and result.eviction_ratio == 0.0
    assert len(result.checkpoint_wcet_s) == 3 and all(w > 0 for w in result.checkpoint_wcet_s)
    # The fallback predictor: N^ = N^_W = N_max, so at token 13 it expects exactly 3 more.
    assert result.rest_error_tokens == 0


def test_a_goal_without_checkpoints_has_none_on_record(make_service):
    service = make_service()
    result = submit(service, GoalRequest('Plan a path to the dock.', budget_s=LONG)).wait()
    assert result.checkpoint_tokens == () and result.rest_error_tokens == 0
