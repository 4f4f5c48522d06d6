"""The core server: admission, the goal queue, executors, queue expiry, stats, shutdown.

No ROS here: the ROS adapter (``timebill_ros.ros``) turns action goals into
:class:`GoalRequest` and results back into messages.
"""

import concurrent.futures
import dataclasses
import threading
import time
import traceback
import uuid

from timebill_ros.engine.prefix_store import PrefixStoreStats
from timebill_ros.server import goals, overrun, status
from timebill_ros.server.admission import make_admission
from timebill_ros.server.executor import Executor
from timebill_ros.server.heap import HeapTrimmer
from timebill_ros.server.goals import GoalRejected, JobResult
from timebill_ros.server.job import Job
from timebill_ros.server.prediction import timed_predict
from timebill_ros.server.runner import JobRunner
from timebill_ros.server.scheduler import JobQueue, QueueFull, make_scheduler_policy
from timebill_ros.server.scheduler.consolidation import cut_batch, join_batch, keep_on_time
from timebill_ros.server.stats import ServerStats
from timebill_ros.timing.model import TimingCoefficients
from timebill_ros.timing.online import DECODE, EXPECTED, PREFILL, TimeModel


def _rejecting(queue_call, *args):
    """Call a JobQueue method; a full or closed queue becomes GoalRejected (its message)."""
    try:
        return queue_call(*args)
    except QueueFull as exc:
        raise GoalRejected(str(exc), error_code=status.ERROR_QUEUE_FULL) from exc
    except RuntimeError as exc:  # closed: the service shuts down
        raise GoalRejected(str(exc), error_code=status.ERROR_SHUTDOWN) from exc


PRIMARY = 'primary'
OFFLOAD = 'offload'


class GoalInfeasible(GoalRejected):
    """Admission found that a goal cannot fit its budget; min_time_s: its least time, s."""

    error_code = status.ERROR_INFEASIBLE

    def __init__(self, message, min_time_s, n_x):
        super().__init__(message)
        self.min_time_s = min_time_s
        self.n_x = n_x


@dataclasses.dataclass(frozen=True)
class ServiceStatus:
    """What the stats topic and /diagnostics show besides the goal window (see stats.py).

    active_goals: queued + running. speed factors and WCET margins: the time model's
    decode and prefill phases (timing/online.py). scheduler_policy: ``scheduler.policy``.
    executors: ((name, busy, queued goals routed to it), ...) of every executor.
    prefix: the prefix stores' counters and sizes, summed over the executors' engines.
    """

    queue_depth: int
    active_goals: int
    busy: bool
    speed_factor_decode: float
    speed_factor_prefill: float
    wcet_margin_decode: float
    wcet_margin_prefill: float
    scheduler_policy: str = ''
    executors: tuple = ()
    prefix: PrefixStoreStats = PrefixStoreStats()


class TimeBillService:
    """Accepts goals, runs them on executors and reports exactly one result per goal.

    engine: an LlmEngine (or same interface). predictor: a LengthPredictor (beside each
    prefill, and u_J at admission). readout: a PrefillReadout (N^ after each prefill, the
    predictor then only gives u_J), or None.
    timing: a timing.online.TimeModel, or the calibration's TimingCoefficients (wrapped in a
    TimeModel with the ``timing`` parameters). clock: monotonic seconds.
    state_path: where the time model's online state is saved (None: not saved).
    log: one line of text per event.
    offload: (engine, TimeModel) of the offload executor (``offload.enabled``), or None.
    tau_tokens: RT-LM's offload threshold tau, tokens: a goal whose u_J exceeds it runs on
    the offload executor.
    batch_step: the primary engine's batched-step fit (timing.batch.BatchStepCoefficients)
    that goals decoding in a batch budget with (``scheduler.consolidation``), or None.
    mask_step_s: seconds a json_schema goal's token mask adds to a decoding step.
    runner: what runs the primary's goals; None = a JobRunner on ``engine`` (the remote
    backend passes its RemoteRunner, ``engine`` then its RemoteModel).
    """

    def __init__(self, config, engine, predictor, timing, clock=time.monotonic,
                 scheduler_policy=None, state_path=None, log=lambda line: None,
                 offload=None, tau_tokens=None, batch_step=None, readout=None, mask_step_s=0.0,
                 runner=None):
        batching = config.scheduler
        if batching.batch_size == 0 and (batching.consolidation or batching.continuous):
            raise ValueError('scheduler.batch_size 0 must be resolved before the service is '
                             'built (factory.build_batch_step)')
        self.config = config
        self.engine = engine
        self.clock = clock
        self.log = log
        if isinstance(timing, TimingCoefficients):
            timing = TimeModel(timing, config.timing.online_settings(),
                               predict_s=None if readout else predictor.expected_time_s,
                               calibration_chunk_tokens=config.engine.prefill_chunk_tokens)
        self.time_model = timing
        self.admission = make_admission(config.admission.policy, timing)
        self.stats = ServerStats(config.stats.window, config.stats.firm_k)
        self.queue = JobQueue(config.queue.max_depth,
                              scheduler_policy or make_scheduler_policy(config), clock)
        # u_J of goals that must wait: the length predictor on its own CPU thread. Its time
        # is the goal's t_Predict (predict_time): the run reuses it instead of predicting.
        self._uncertainty_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix='timebill-uncertainty')
        self.predictor = predictor
        self.readout = readout
        if readout is not None:  # every prefill pools the layers the readout reads
            engine.pool_layers = readout.pool_layers
            if offload is not None:
                offload[0].pool_layers = readout.pool_layers
        self.runner = runner or JobRunner(engine, predictor, timing, config, clock, batch_step,
                                          readout, recheck=self._on_dequeue,
                                          mask_step_s=mask_step_s)
        self.executors = [Executor('primary', self.queue, self.runner, self._on_dequeue,
                                   self._after_job, log,
                                   accept=lambda job: self._accepts(PRIMARY, job),
                                   cut=self._cut if batching.consolidation else None,
                                   join=self._join if batching.continuous else None,
                                   capacity=batching.batch_size)]
        self.tau_tokens = tau_tokens
        self._mask_step_s = mask_step_s
        self._lifecycle = threading.Lock()  # start / attach_offload / shutdown
        self._started = False
        if offload is not None:
            if tau_tokens is None:
                raise ValueError('an offload executor needs tau_tokens')
            self.executors.append(self._offload_executor(offload))
        self.state_path = state_path
        self._last_save_s = clock()
        self.heap = HeapTrimmer()  # the freed heap goes back to the system after goals
        self._save_lock = threading.Lock()
        self._closed = False
        self._accepting = True  # False while paused (the node's lifecycle: inactive)
        self._live = set()  # goal ids admitted and not ended yet
        self._live_lock = threading.Lock()
        self._reaper_stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name='timebill-reaper',
                                        daemon=True)

    def _offload_executor(self, offload):
        """Return the offload executor of ``offload`` ((engine, TimeModel)), not started."""
        offload_engine, offload_model = offload
        if self.readout is not None:
            offload_engine.pool_layers = self.readout.pool_layers
        runner = JobRunner(offload_engine, self.predictor, offload_model, self.config,
                           self.clock, readout=self.readout, recheck=self._on_dequeue,
                           mask_step_s=self._mask_step_s)
        return Executor(OFFLOAD, self.queue, runner, self._on_dequeue, self._after_job,
                        self.log, accept=lambda job: self._accepts(OFFLOAD, job))

    # --- lifecycle -------------------------------------------------------------------------
    def start(self):
        """Start the executors and the queue reaper."""
        with self._lifecycle:
            self._started = True
            for executor in self.executors:
                executor.start()
        self._reaper.start()

    def attach_offload(self, offload, tau_tokens) -> bool:
        """Add the offload executor to a service that may already serve; False once shut down.

        offload: (engine, TimeModel), tau_tokens: RT-LM's tau, as in the constructor. Until
        it is attached every goal runs on the primary (``route``). What the factory does when
        the offload executor is on another kind of device than the primary (the ARM cores
        beside a GPU): its load and CPU calibration run after the primary's, while it serves.
        """
        if tau_tokens is None:
            raise ValueError('an offload executor needs tau_tokens')
        with self._lifecycle:
            if self._closed or any(e.name == OFFLOAD for e in self.executors):
                return False
            executor = self._offload_executor(offload)
            self.tau_tokens = tau_tokens
            self.executors = self.executors + [executor]  # readers iterate a whole list
            if self._started:
                executor.start()
        return True

    def warm_up(self):
        """Run the start-up warm-up goal (see JobRunner.warm_up); call before start()."""
        self.runner.warm_up()
        decode, prefill = (self.time_model.status(p) for p in (DECODE, PREFILL))
        self.log(f'time model warm-up: prefill runs at {prefill.speed_factor:.2f}x and '
                 f'decoding at {decode.speed_factor:.2f}x the calibrated times')

    def pause(self):
        """Refuse new goals (REJECTED, ERROR_INACTIVE); queued and running goals go on.

        Each of those has a deadline, so they end on their own (any terminal state), in at
        most the longest of their budgets; :meth:`shutdown` ends them at once instead.
        """
        self._accepting = False

    def resume(self):
        """Admit goals again after :meth:`pause`."""
        self._accepting = True

    @property
    def accepting(self):
        """Return True while new goals are admitted (not paused, not shut down)."""
        return self._accepting and not self._closed

    def shutdown(self, timeout_s=30.0):
        """End every queued or running goal with FAILED, stop all threads, save the state."""
        with self._lifecycle:
            self._closed = True
        for job in self.queue.close():
            job.cancel('shutdown')
            job.finish(JobResult(status=status.FAILED, stop_phase='queue',
                                 message='server shutting down; goal was still queued',
                                 error_code=status.ERROR_SHUTDOWN))
        for executor in self.executors:
            for job in executor.running:
                job.cancel('shutdown')
        for executor in self.executors:
            executor.stop(timeout_s)
        self._reaper_stop.set()
        with self.queue.cond:
            self.queue.cond.notify_all()
        if self._reaper.is_alive():
            self._reaper.join(timeout_s)
        self._uncertainty_pool.shutdown(wait=True, cancel_futures=True)
        self.save_state()

    def save_state(self):
        """Save the time model's online state to ``state_path`` (if any); log failures."""
        if self.state_path is None:
            return
        with self._save_lock:
            try:
                self.time_model.save(self.state_path)
            except OSError as exc:
                self.log(f'warning: could not save the time-model state: {exc}')
            self._last_save_s = self.clock()

    # --- goals -----------------------------------------------------------------------------
    @property
    def queue_depth(self):
        """Return the number of goals waiting."""
        return len(self.queue)

    @property
    def healthy(self):
        """Return True while every executor thread and the reaper run (after start())."""
        return self._reaper.is_alive() and all(e.alive for e in self.executors)

    @property
    def idle(self):
        """Return True when no admitted goal is queued, running or about to run."""
        with self._live_lock:
            return not self._live

    @property
    def busy(self):
        """Return True while some executor runs a goal."""
        return any(executor.current is not None for executor in self.executors)

    def status(self) -> ServiceStatus:
        """Return the queue and time-model figures for stats and diagnostics."""
        depth = self.queue_depth
        routed = [self.route(job) for job in self.queue.waiting()]
        running = sum(len(executor.running) for executor in self.executors)
        decode, prefill = (self.time_model.status(p) for p in (DECODE, PREFILL))
        return ServiceStatus(
            queue_depth=depth, active_goals=depth + running, busy=running > 0,
            speed_factor_decode=decode.speed_factor, speed_factor_prefill=prefill.speed_factor,
            wcet_margin_decode=decode.upper_margin, wcet_margin_prefill=prefill.upper_margin,
            scheduler_policy=self.queue.policy.name,
            executors=tuple((e.name, e.current is not None, routed.count(e.name))
                            for e in self.executors),
            prefix=self.prefix_stats())

    def prefix_stats(self) -> PrefixStoreStats:
        """Return the prefix stores' counters and sizes summed over the executors' engines."""
        stores = [getattr(e.runner.engine, 'prefix_store', None) for e in self.executors]
        found = [dataclasses.astuple(store.stats()) for store in stores if store is not None]
        return PrefixStoreStats(*(sum(values) for values in zip(*found)))

    def submit(self, request, on_feedback, on_done, received_s=None):
        """Admit a goal; return its Job, or None when it was rejected (on_done already called).

        on_feedback(Feedback) and on_done(JobResult) are called from server threads;
        on_done is called exactly once.
        """
        received_s = self.clock() if received_s is None else received_s
        goal_id = request.goal_id or uuid.uuid4().hex

        def done(result):
            with self._live_lock:
                self._live.discard(goal_id)
            try:
                self.stats.record(result)
            except Exception:  # stats are a side line: the result still goes out
                self.log(f'goal {goal_id}: stats failed: {traceback.format_exc()}')
            on_done(result)

        try:
            job = self._admit(request, goal_id, received_s, on_feedback, done)
        except GoalRejected as exc:
            done(JobResult(status=status.REJECTED, message=str(exc), goal_id=goal_id,
                           finish_reason=status.FINISH_REJECTED, error_code=exc.error_code,
                           total_time_s=self.clock() - received_s,
                           budget_s=request.budget_s or 0.0, stop_phase='admission',
                           infeasible=isinstance(exc, GoalInfeasible),
                           min_time_s=getattr(exc, 'min_time_s', 0.0),
                           prompt_tokens=getattr(exc, 'n_x', 0)))
            return None
        except Exception as exc:  # a fault before the goal was queued: it ends here
            self.log(f'goal {goal_id}: admission failed: {traceback.format_exc()}')
            done(JobResult(status=status.FAILED, goal_id=goal_id, stop_phase='admission',
                           error_code=status.ERROR_INTERNAL, finish_reason=status.FINISH_ERROR,
                           message=f'internal error at admission: {type(exc).__name__}: {exc}',
                           total_time_s=self.clock() - received_s,
                           budget_s=request.budget_s or 0.0))
            return None
        return job

    def _after_push(self, job, must_wait, on_feedback, received_s):
        """Start u_J and send the QUEUED feedback of a queued goal; never raise.

        The prediction failing to start (its pool shut down) is logged and the goal runs on
        (its u_J stays N_max). A raising feedback callback ends the goal FAILED, as it does
        while the goal runs (runner.py): stopped where it is, its result names the fault.
        """
        if must_wait:
            try:
                self._predict_uncertainty(job)
            except Exception:
                self.log(f'goal {job.goal_id}: the admission prediction failed to start: '
                         f'{traceback.format_exc()}')
        try:
            on_feedback(goals.Feedback(phase=status.PHASE_QUEUED,
                                       elapsed_s=self.clock() - received_s))
        except Exception as exc:
            self.log(f'goal {job.goal_id}: queued feedback failed: {traceback.format_exc()}')
            job.cancel('feedback')
            self.queue.remove(job)
            job.finish(JobResult(status=status.FAILED, error_code=status.ERROR_INTERNAL,
                                 stop_phase='queue', message=f'feedback failed: '
                                 f'{type(exc).__name__}: {exc}'))

    def cancel(self, job):
        """Cancel a goal: at once when queued, at the engine's next check when running."""
        job.cancel('client')
        if self.queue.remove(job):
            job.finish(JobResult(status=status.CANCELED, message='canceled while queued',
                                 stop_phase='queue'))

    def _admit(self, request, goal_id, received_s, on_feedback, on_done):
        if self._closed:
            raise GoalRejected('server is shutting down', error_code=status.ERROR_SHUTDOWN)
        if not self._accepting:
            raise GoalRejected('server is inactive (lifecycle state); goals are refused until '
                               'it is activated', error_code=status.ERROR_INACTIVE)
        messages = goals.check_prompt(request, self.config.queue.max_prompt_chars)
        goals.check_stop(request)
        sampling = goals.resolve_sampling(request)
        goals.check_schema(request, self.config.queue.max_schema_chars)
        deadline_s = goals.resolve_deadline(request, received_s)
        policy = overrun.policy_by_name(
            goals.resolve_policy(request, self.config.overrun.default_policy))
        n_max = goals.resolve_max_new_tokens(request, self.config.engine.max_new_tokens,
                                             self.config.engine.max_model_new_tokens)
        # Before the grammar compiler's and the tokenizer's work; again at the push.
        _rejecting(self.queue.check_room)
        grammar = self._compile_schema(request, deadline_s)
        input_ids = self._encode(request, messages)
        # The answer cannot outgrow the context: N_x + N_max <= context tokens.
        n_max = min(n_max, self.engine.context_tokens - len(input_ids))
        job = Job(request=request, goal_id=goal_id, received_s=received_s,
                  deadline_s=deadline_s, policy=policy, n_max=n_max, input_ids=input_ids,
                  on_feedback=on_feedback, on_done=on_done, clock=self.clock, log=self.log,
                  n_cached=self.engine.match_prefix(input_ids).n_tokens, sampling=sampling,
                  grammar=grammar)
        verdict = self.admission.check(job, self.clock())
        if not verdict.admit:
            raise GoalInfeasible(verdict.message, verdict.min_time_s, job.n_x)
        self._apply(job, verdict)
        job.estimated_time_s = self.estimated_time_s(job)
        must_wait = self.busy or self.queue_depth > 0
        with self._live_lock:
            self._live.add(goal_id)
        try:
            _rejecting(self.queue.push, job)
        except BaseException:
            with self._live_lock:
                self._live.discard(goal_id)
            raise
        self._after_push(job, must_wait, on_feedback, received_s)  # never raises
        return job

    # --- executors ---------------------------------------------------------------------
    def route(self, job):
        """Return the executor a goal belongs to: OFFLOAD when its u_J is known and > tau.

        A bucketed predictor puts many predictions at its cap (the RLP's top bucket, N_max):
        when tau sits at that cap, no prediction exceeds it, so u_J >= tau counts there
        (the top bucket means "at least this long").
        """
        u_j = job.predicted_tokens
        if len(self.executors) < 2 or u_j is None:
            return PRIMARY
        if u_j > self.tau_tokens or (u_j >= self.tau_tokens >= job.n_max):
            return OFFLOAD
        return PRIMARY

    def _cut(self, jobs, now_s):
        """Consolidation (scheduler.consolidation): the primary's batch among ``jobs``.

        The policy's first choice always runs; goals routed to the offload executor never
        join a batch (RT-LM Sec. IV-D), so when the primary takes one of them (the offload
        executor being busy) it runs alone.
        """
        first = self.queue.policy.select(jobs, now_s)
        own = [i for i, job in enumerate(jobs) if self.route(job) == PRIMARY]
        if first not in own:
            return [first]
        cfg = self.config.scheduler
        picked = [own[i] for i in cut_batch([jobs[i] for i in own], now_s, self.queue.policy,
                                            cfg.batch_size, cfg.b, cfg.length_ratio)]
        if len(picked) == 1:
            return picked
        kept = keep_on_time([jobs[i] for i in picked], now_s, self._prefill_alone_s,
                            self._decode_alone_s,
                            self.runner.batch_scale.scale)
        return [picked[i] for i in kept]

    def _prefill_alone_s(self, job):
        """Return the goal's expected prefill, seconds (primary time model)."""
        return self.time_model.prefill_s(job.n_x, EXPECTED, n_cached=job.n_cached)

    def _decode_alone_s(self, job):
        """Return the goal's expected decoding alone, seconds: u_J tokens at alpha 0."""
        tokens = min(job.n_max, max(1, job.uncertainty_tokens))
        return self.time_model.decode_s(job.n_x, 0.0, tokens, EXPECTED)

    def _join(self, jobs, now_s, room, members):
        """Continuous batching (scheduler.continuous): which of ``jobs`` join the batch now.

        None joins a batch that holds a goal routed to the offload executor, and no such
        goal joins one; with consolidation, only goals of similar u_J join.
        """
        if any(self.route(member) != PRIMARY for member in members):
            return []
        own = [i for i, job in enumerate(jobs) if self.route(job) == PRIMARY]
        cfg = self.config.scheduler
        picked = join_batch([jobs[i] for i in own], now_s, self.queue.policy, room, members,
                            cfg.length_ratio if cfg.consolidation else None)
        return [own[i] for i in picked]

    def _accepts(self, name, job):
        """Return True if executor ``name`` may take ``job``.

        Its own goals, and another executor's while that one is busy (RT-LM Sec. IV-D: an
        idle executor takes work rather than wait).
        """
        owner = self.route(job)
        if owner == name:
            return True
        return any(e.name == owner and e.current is not None for e in self.executors)

    def estimated_time_s(self, job):
        """Return t^_J, seconds: prefill plus u_J decoding steps at the EXPECTED bound."""
        model, n_x = self.time_model, job.n_x
        steps = max(job.uncertainty_tokens - 1, 0)
        return (model.prefill_s(n_x, EXPECTED, n_cached=job.n_cached)
                + steps * model.step_s(n_x + steps // 2, EXPECTED))

    def _uses_uncertainty(self):
        """Return whether anything reads a waiting goal's u_J (so it is worth predicting).

        The scheduler's order (luf, muf, slack, up), consolidation and continuous batching
        (goals of similar u_J together), the offload route (u_J > tau) and, without a prefill
        readout, the run (u_J is its N^). Otherwise - the default fifo with the readout - the
        prediction would only take the CPU from the goal that runs meanwhile: the RLP over
        a 2-3k-token robot context, queued behind a Skip-Next overrun, runs beside that
        goal's steps on the same cores (docs/benchmark.md).
        """
        cfg = self.config.scheduler
        return (self.queue.policy.uses_uncertainty or cfg.consolidation or cfg.continuous
                or self.tau_tokens is not None or self.readout is None)

    def _predict_uncertainty(self, job):
        """Start u_J for a goal that has to wait (``scheduler.uncertainty: predictor``).

        The prediction runs on its own CPU thread; the run reuses it as N^ (goal_run.py).
        Not started when nothing would read it (:meth:`_uses_uncertainty`).
        """
        if self.config.scheduler.uncertainty != 'predictor' or not self._uses_uncertainty():
            return
        future = self._uncertainty_pool.submit(timed_predict, self.predictor,
                                               job.request.prompt, job.input_ids, job.n_max,
                                               self.clock, self.config.budget.upper_quantile)
        job.prediction = future
        future.add_done_callback(lambda done: self._uncertainty_known(job, done))

    def _uncertainty_known(self, job, future):
        """Record u_J and t^_J once the admission prediction is in (any thread)."""
        if future.cancelled() or future.exception() is not None:
            return  # the run predicts again; u_J stays N_max meanwhile
        n_hat = future.result().n_hat
        if 0 <= n_hat <= job.n_max:
            job.predicted_tokens = n_hat
            job.estimated_time_s = self.estimated_time_s(job)

    def _apply(self, job, verdict):
        """Record an admitting verdict on the job: least time, note, queue expiry."""
        job.min_time_s = verdict.min_time_s
        if verdict.infeasible and not job.infeasible:  # the first finding says the most
            job.infeasible = True
            job.admission_note = verdict.message
        job.expires_s = (job.deadline_s if self.admission.name == 'none' else
                         job.policy.queue_expiry_s(job.deadline_s, verdict.min_time_s))

    def precompile(self, request, received_s=None) -> None:
        """Compile a goal's json_schema ahead of :meth:`submit`; never raises.

        The node calls it before taking its slot lock, so a slow compile holds no other
        goal's submit; submit then finds the grammar cached (or the refusal, at once).
        """
        received_s = self.clock() if received_s is None else received_s
        try:
            goals.check_schema(request, self.config.queue.max_schema_chars)
            self._compile_schema(request, goals.resolve_deadline(request, received_s))
        except Exception:  # submit refuses the goal with the reason
            pass

    def _compile_schema(self, request, deadline_s):
        """Return the goal's compiled json_schema, None without one; GoalRejected if bad.

        The compile is waited for at most queue.max_schema_compile_s, and never past the
        goal's deadline.
        """
        text = request.json_schema
        if not text:
            return None
        timeout_s = max(0.0, min(self.config.queue.max_schema_compile_s,
                                 deadline_s - self.clock()))
        try:
            return self.engine.schemas.compile(text, timeout_s)
        except ValueError as exc:
            raise GoalRejected(str(exc), error_code=status.ERROR_INVALID_SCHEMA) from None

    def _encode(self, request, messages=()):
        try:
            input_ids = self.engine.encode(request.prompt, request.system_prompt, messages)
        except Exception as exc:
            raise GoalRejected(f'prompt could not be tokenized: {exc}',
                               error_code=status.ERROR_INVALID_PROMPT) from exc
        limit = self.engine.context_tokens
        if len(input_ids) >= limit:
            raise GoalRejected(
                f'prompt is {len(input_ids)} tokens; the model context is {limit} tokens',
                error_code=status.ERROR_CONTEXT_OVERFLOW)
        return input_ids

    # --- leaving the queue ---------------------------------------------------------------
    def _on_dequeue(self, job):
        """Admission again when a goal leaves the queue; a REJECTED result if it cannot fit."""
        verdict = self.admission.check(job, self.clock(), queued=True)
        if verdict.admit:
            self._apply(job, verdict)
            return None
        return self._infeasible_result(verdict)

    @staticmethod
    def _infeasible_result(verdict):
        return JobResult(status=status.REJECTED, message=verdict.message, infeasible=True,
                         min_time_s=verdict.min_time_s, stop_phase='queue',
                         error_code=status.ERROR_INFEASIBLE)

    def _after_job(self, job):
        if self.clock() - self._last_save_s >= self.config.timing.persist_period_s:
            self.save_state()
        self.heap.maybe_release(idle=self.idle)

    def _reap_loop(self):
        """End queued goals that expired: can no longer fit (Kill, Partial) or came due.

        A fault in one round is logged and the loop goes on: the reaper must outlive it.
        """
        while not self._reaper_stop.is_set():
            try:
                self._reap_once()
            except Exception:
                self.log(f'reaper: round failed: {traceback.format_exc()}')
                self._reaper_stop.wait(0.1)

    def _reap_once(self):
        """Wait for the next expiry (at most 0.5 s), then end what expired."""
        with self.queue.cond:
            expiry = self.queue.next_expiry()
            wait_s = 0.5 if expiry is None else expiry - self.clock()
            if wait_s > 0:
                self.queue.cond.wait(min(wait_s, 0.5))
        now = self.clock()
        for job in self.queue.expired(now):
            result = self._expired_result(job, now)
            if result is not None and self.queue.remove(job):
                job.finish(result)

    def _expired_result(self, job, now):
        """Return the result of an expired queued goal, or None to keep it queued.

        SKIPPED when it came due while a skip-next goal overran; REJECTED when it can no
        longer fit before its deadline; KILLED when the deadline passed. None: the time
        model got faster meanwhile and the goal fits again (its expiry moves).
        """
        for running in (job for executor in self.executors for job in executor.running):
            if running.policy.skips_queued(running.deadline_s, now):
                return JobResult(
                    status=status.SKIPPED, kill_latency_s=None, stop_phase='queue',
                    message=f'skipped: came due while goal {running.goal_id} overran '
                            'under skip-next')
        if now < job.deadline_s:
            verdict = self.admission.check(job, now, queued=True)
            if verdict.admit:
                self._apply(job, verdict)
                return None
            return self._infeasible_result(verdict)
        return JobResult(status=status.KILLED, kill_latency_s=now - job.deadline_s,
                         stop_phase='queue', message='deadline passed while queued; not run')
