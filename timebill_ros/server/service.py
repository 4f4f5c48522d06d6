"""The core server: admission, the goal queue, executors, deadline expiry, stats, shutdown.

No ROS here: the ROS adapter (``timebill_ros.ros``) turns action goals into
:class:`GoalRequest` and results back into messages.
"""

import threading
import time
import uuid

from timebill_ros.server import goals, overrun, status
from timebill_ros.server.executor import Executor, JobRunner
from timebill_ros.server.goals import GoalRejected, JobResult
from timebill_ros.server.job import Job
from timebill_ros.server.scheduler import FifoPolicy, JobQueue, QueueFull
from timebill_ros.server.stats import ServerStats


class TimeBillService:
    """Accepts goals, runs them on executors and reports exactly one result per goal.

    engine: an LlmEngine (or same interface). predictor: a LengthPredictor.
    coefficients: TimingCoefficients (Eq. 4). clock: monotonic seconds.
    """

    def __init__(self, config, engine, predictor, coefficients, clock=time.monotonic,
                 scheduler_policy=None):
        self.config = config
        self.engine = engine
        self.clock = clock
        self.stats = ServerStats(config.stats.window)
        self.queue = JobQueue(config.queue.max_depth, scheduler_policy or FifoPolicy(), clock)
        runner = JobRunner(engine, predictor, coefficients, config, clock)
        self.executors = [Executor('primary', self.queue, runner)]
        self._closed = False
        self._reaper_stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name='timebill-reaper',
                                        daemon=True)

    # --- lifecycle -------------------------------------------------------------------------
    def start(self):
        """Start the executors and the deadline reaper."""
        for executor in self.executors:
            executor.start()
        self._reaper.start()

    def shutdown(self, timeout_s=30.0):
        """End every queued or running goal with FAILED and stop all threads."""
        self._closed = True
        for job in self.queue.close():
            job.cancel('shutdown')
            job.finish(JobResult(status=status.FAILED,
                                 message='server shutting down; goal was still queued'))
        for executor in self.executors:
            if executor.current is not None:
                executor.current.cancel('shutdown')
        for executor in self.executors:
            executor.stop(timeout_s)
        self._reaper_stop.set()
        with self.queue.cond:
            self.queue.cond.notify_all()
        if self._reaper.is_alive():
            self._reaper.join(timeout_s)

    # --- goals -----------------------------------------------------------------------------
    @property
    def queue_depth(self):
        """Return the number of goals waiting."""
        return len(self.queue)

    @property
    def busy(self):
        """Return True while some executor runs a goal."""
        return any(executor.current is not None for executor in self.executors)

    def submit(self, request, on_feedback, on_done, received_s=None):
        """Admit a goal; return its Job, or None when it was rejected (on_done already called).

        on_feedback(Feedback) and on_done(JobResult) are called from server threads;
        on_done is called exactly once.
        """
        received_s = self.clock() if received_s is None else received_s
        goal_id = request.goal_id or uuid.uuid4().hex

        def done(result):
            self.stats.record(result)
            on_done(result)

        try:
            job = self._admit(request, goal_id, received_s, on_feedback, done)
        except GoalRejected as exc:
            done(JobResult(status=status.REJECTED, message=str(exc), goal_id=goal_id,
                           total_time_s=self.clock() - received_s,
                           budget_s=request.budget_s or 0.0))
            return None
        return job

    def cancel(self, job):
        """Cancel a goal: at once when queued, at the engine's next check when running."""
        job.cancel('client')
        if self.queue.remove(job):
            job.finish(JobResult(status=status.CANCELED, message='canceled while queued'))

    def _admit(self, request, goal_id, received_s, on_feedback, on_done):
        if self._closed:
            raise GoalRejected('server is shutting down')
        goals.check_prompt(request)
        deadline_s = goals.resolve_deadline(request, received_s)
        policy = overrun.policy_by_name(
            goals.resolve_policy(request, self.config.overrun.default_policy))
        n_max = goals.resolve_max_new_tokens(request, self.config.engine.max_new_tokens,
                                             self.config.engine.max_model_new_tokens)
        input_ids = self._encode(request)
        # The answer cannot outgrow the context: N_x + N_max <= context tokens.
        n_max = min(n_max, self.engine.context_tokens - len(input_ids))
        job = Job(request=request, goal_id=goal_id, received_s=received_s,
                  deadline_s=deadline_s, policy=policy, n_max=n_max, input_ids=input_ids,
                  on_feedback=on_feedback, on_done=on_done, clock=self.clock)
        try:
            self.queue.push(job)
        except (QueueFull, RuntimeError) as exc:
            raise GoalRejected(str(exc)) from exc
        on_feedback(goals.Feedback(phase=status.PHASE_QUEUED,
                                   elapsed_s=self.clock() - received_s))
        return job

    def _encode(self, request):
        try:
            input_ids = self.engine.encode(request.prompt, request.system_prompt)
        except Exception as exc:
            raise GoalRejected(f'prompt could not be tokenized: {exc}') from exc
        limit = self.engine.context_tokens
        if len(input_ids) >= limit:
            raise GoalRejected(
                f'prompt is {len(input_ids)} tokens; the model context is {limit} tokens')
        return input_ids

    # --- deadline expiry of queued goals ------------------------------------------------------
    def _reap_loop(self):
        while not self._reaper_stop.is_set():
            with self.queue.cond:
                next_deadline = self.queue.next_deadline()
                wait_s = 0.5 if next_deadline is None else next_deadline - self.clock()
                if wait_s > 0:
                    self.queue.cond.wait(min(wait_s, 0.5))
            for job in self.queue.pop_expired(self.clock()):
                job.finish(self._expired_result(job))

    def _expired_result(self, job):
        """SKIPPED when it came due while a skip-next goal overran, else KILLED."""
        now = self.clock()
        for executor in self.executors:
            running = executor.current
            if (running is not None and running.policy.name == 'skip_next'
                    and running.deadline_s < now):
                return JobResult(
                    status=status.SKIPPED, kill_latency_s=None,
                    message=f'skipped: came due while goal {running.goal_id} overran '
                            'under skip-next')
        return JobResult(status=status.KILLED, kill_latency_s=now - job.deadline_s,
                         message='deadline passed while queued; not run')
