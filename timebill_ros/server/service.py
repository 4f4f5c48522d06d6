"""The service front: lifecycle, submit / cancel, exactly one result per goal, stats.

No ROS here: the ROS adapter (``timebill_ros.ros``) turns action goals into
:class:`GoalRequest` and results back into messages. Admission is the Admitter's
(server/admitter.py), u_J at admission the Uncertainty's (server/uncertainty.py), routing,
batching and the queue's reaper the Dispatcher's (server/dispatcher.py).
"""

import dataclasses
import threading
import time
import traceback
import uuid

from timebill_ros.engine.prefix_store import PrefixStoreStats
from timebill_ros.server import goals, status
from timebill_ros.server.admitter import Admitter, GoalInfeasible, rejecting
from timebill_ros.server.dispatcher import Dispatcher, OFFLOAD, PRIMARY
from timebill_ros.server.executor import Executor
from timebill_ros.server.heap import HeapTrimmer
from timebill_ros.server.goals import GoalRejected, JobResult
from timebill_ros.server.runner import JobRunner
from timebill_ros.server.scheduler import JobQueue, make_scheduler_policy
from timebill_ros.server.stats import ServerStats
from timebill_ros.server.uncertainty import Uncertainty
from timebill_ros.timing.model import TimingCoefficients
from timebill_ros.timing.online import DECODE, PREFILL, TimeModel

__all__ = ['GoalInfeasible', 'OFFLOAD', 'PRIMARY', 'ServiceStatus', 'TimeBillService']


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
        self.stats = ServerStats(config.stats.window, config.stats.firm_k)
        self.queue = JobQueue(config.queue.max_depth,
                              scheduler_policy or make_scheduler_policy(config), clock)
        self.admitter = Admitter(config, engine, timing, self.queue, clock)
        self.uncertainty = Uncertainty(config, predictor, readout, self.queue.policy,
                                       self.admitter.estimated_time_s, clock)
        self.dispatcher = Dispatcher(config, self.queue, timing, self.admitter.recheck,
                                     clock, log)
        self.predictor = predictor
        self.readout = readout
        if readout is not None:  # every prefill pools the layers the readout reads
            engine.pool_layers = readout.pool_layers
            if offload is not None:
                offload[0].pool_layers = readout.pool_layers
        self.runner = runner or JobRunner(engine, predictor, timing, config, clock, batch_step,
                                          readout, recheck=self.admitter.recheck,
                                          mask_step_s=mask_step_s)
        dispatcher = self.dispatcher
        dispatcher.executors = [Executor(
            PRIMARY, self.queue, self.runner, self.admitter.recheck, self._after_job, log,
            accept=lambda job: dispatcher.accepts(PRIMARY, job),
            cut=dispatcher.cut if batching.consolidation else None,
            join=dispatcher.join if batching.continuous else None,
            capacity=batching.batch_size)]
        dispatcher.tau_tokens = tau_tokens
        self._mask_step_s = mask_step_s
        self._lifecycle = threading.Lock()  # start / attach_offload / shutdown
        self._started = False
        if offload is not None:
            if tau_tokens is None:
                raise ValueError('an offload executor needs tau_tokens')
            dispatcher.executors.append(self._offload_executor(offload))
        self.state_path = state_path
        self._last_save_s = clock()
        self.heap = HeapTrimmer()  # the freed heap goes back to the system after goals
        self._save_lock = threading.Lock()
        self._closed = False
        self._accepting = True  # False while paused (the node's lifecycle: inactive)
        self._live = set()  # goal ids admitted and not ended yet
        self._live_lock = threading.Lock()

    @property
    def executors(self):
        """Return the executors: the primary, then the offload executor once attached."""
        return self.dispatcher.executors

    def precompile(self, request, received_s=None) -> None:
        """Compile a goal's json_schema ahead of :meth:`submit`; never raises."""
        self.admitter.precompile(request, received_s)

    def _offload_executor(self, offload):
        """Return the offload executor of ``offload`` ((engine, TimeModel)), not started."""
        offload_engine, offload_model = offload
        if self.readout is not None:
            offload_engine.pool_layers = self.readout.pool_layers
        runner = JobRunner(offload_engine, self.predictor, offload_model, self.config,
                           self.clock, readout=self.readout, recheck=self.admitter.recheck,
                           mask_step_s=self._mask_step_s)
        return Executor(OFFLOAD, self.queue, runner, self.admitter.recheck, self._after_job,
                        self.log, accept=lambda job: self.dispatcher.accepts(OFFLOAD, job))

    # --- lifecycle -------------------------------------------------------------------------
    def start(self):
        """Start the executors and the queue reaper."""
        with self._lifecycle:
            self._started = True
            for executor in self.executors:
                executor.start()
        self.dispatcher.start_reaper()

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
            self.dispatcher.tau_tokens = tau_tokens
            # readers iterate a whole list
            self.dispatcher.executors = self.executors + [executor]
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
        self.dispatcher.stop_reaper(timeout_s)
        self.uncertainty.shutdown()
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
        return self.dispatcher.reaper_alive and all(e.alive for e in self.executors)

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
        routed = [self.dispatcher.route(job) for job in self.queue.waiting()]
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
                self.uncertainty.start(job, offloading=self.dispatcher.tau_tokens is not None)
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
        job = self.admitter.job_of(request, goal_id, received_s, on_feedback, on_done,
                                   self.log)
        must_wait = self.busy or self.queue_depth > 0
        with self._live_lock:
            self._live.add(goal_id)
        try:
            rejecting(self.queue.push, job)
        except BaseException:
            with self._live_lock:
                self._live.discard(goal_id)
            raise
        self._after_push(job, must_wait, on_feedback, received_s)  # never raises
        return job

    # --- leaving the queue ---------------------------------------------------------------
    def _after_job(self, job):
        if self.clock() - self._last_save_s >= self.config.timing.persist_period_s:
            self.save_state()
        self.heap.maybe_release(idle=self.idle)
