"""Executors: a worker thread that takes goals from the queue and runs them with a JobRunner.

One goal at a time per executor, or, with a consolidation rule (``cut``), the goals it picks
as one decoding batch. Before a goal runs, ``on_dequeue`` may end it instead (it was
canceled meanwhile, or admission finds it can no longer fit after waiting).
"""

import threading
import traceback

from timebill_ros.server import status
from timebill_ros.server.goals import JobResult
from timebill_ros.timing.batch import BATCH_SIZES


def max_running_goals(config) -> int:
    """Return the most goals a service of ``config`` (a ServerConfig) runs at once.

    The primary runs one goal, or a batch of up to ``scheduler.batch_size`` with consolidation
    or continuous batching (batch_size 0 resolves at start-up to a probed size, at most the
    largest of timing.batch.BATCH_SIZES); the offload executor runs one more.
    """
    scheduler = config.scheduler
    primary = 1
    if scheduler.consolidation or scheduler.continuous:
        primary = scheduler.batch_size or max(BATCH_SIZES)
    return primary + (1 if config.offload.enabled else 0)


class Executor:
    """A worker thread running jobs from ``queue`` with ``runner`` (a JobRunner).

    on_dequeue(job) -> JobResult or None: a result ends the job without running it.
    after_job(job): called after each job, on this thread (persistence, bookkeeping).
    log: one line of text per fault. accept(job) -> bool: which queued jobs this executor
    may take (None: all). cut(jobs, now_s) -> indices: the consolidation rule that picks a
    batch among them (None: one goal at a time). join(jobs, now_s, room, members) ->
    indices: continuous batching, which waiting jobs join the decoding batch between steps
    (None: none do); capacity: the most goals in a batch then.
    """

    def __init__(self, name, queue, runner, on_dequeue=None, after_job=None, log=print,
                 accept=None, cut=None, join=None, capacity=None):
        self.name = name
        self.accept = accept
        self.cut = cut
        self.join = join
        self.capacity = capacity
        self.queue = queue
        self.runner = runner
        self.on_dequeue = on_dequeue or (lambda job: None)
        self.after_job = after_job or (lambda job: None)
        self.log = log
        self.running = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f'timebill-{name}', daemon=True)

    def start(self):
        """Start the worker thread."""
        self._thread.start()

    def stop(self, timeout_s=30.0):
        """Ask the loop to end after the current job and wait for it."""
        self._stop.set()
        with self.queue.cond:
            self.queue.cond.notify_all()
        self._thread.join(timeout_s)
        self.runner.close()

    @property
    def current(self):
        """Return a goal this executor runs now (the first of its batch), or None."""
        running = self.running
        return running[0] if running else None

    @property
    def alive(self):
        """Return True while the worker thread runs."""
        return self._thread.is_alive()

    def _loop(self):
        bind = getattr(self.runner.engine, 'bind_thread', None)
        if bind is not None:
            bind()  # this engine's torch threads on this thread
        while not self._stop.is_set():
            try:
                jobs = self.queue.pop_batch(timeout_s=0.5, accept=self.accept, cut=self.cut)
            except Exception:  # the queue's policy failed: log, keep the thread
                self.log(f'executor {self.name}: taking a goal failed: {traceback.format_exc()}')
                self._stop.wait(0.1)
                continue
            if not jobs:
                continue
            self.running = list(jobs)
            for job in jobs:
                job.executor = self.name
            try:
                self._run(jobs)
            except Exception as exc:  # never let one goal end the thread that runs them all
                self._fail_running(exc)
            finally:
                self.running = []
            try:
                self.after_job(jobs[-1])
            except Exception:
                self.log(f'executor {self.name}: after-job hook failed: '
                         f'{traceback.format_exc()}')

    def _fail_running(self, exc):
        """End every goal of the failed run FAILED: its first goals and those that joined.

        Goals that already ended keep their result (Job.finish delivers once).
        """
        running = list(self.running)
        self.log(f'executor {self.name}: goals {[j.goal_id for j in running]} failed: '
                 f'{traceback.format_exc()}')
        for job in running:
            job.finish(JobResult(status=status.FAILED, error_code=status.ERROR_INTERNAL,
                                 message=f'internal error: {type(exc).__name__}: {exc}'))

    def _run(self, jobs):
        runnable = [job for job in jobs if not self._ended_before_start(job)]
        if not runnable:
            return
        if self.join is not None:
            self.runner.run_batch(runnable, _finish, more=self._more, capacity=self.capacity)
        elif len(runnable) == 1:
            runnable[0].finish(self.runner.run(runnable[0]))
        else:
            self.runner.run_batch(runnable, _finish)

    def _more(self, room, members):
        """Return waiting jobs that join the decoding batch now (continuous batching)."""
        if self._stop.is_set():
            return []

        def cut(jobs, now_s):
            return self.join(jobs, now_s, room, members)

        try:
            joining = self.queue.pop_batch(timeout_s=0.0, accept=self.accept, cut=cut)
        except Exception:  # the join rule failed: the batch decodes on without joiners
            self.log(f'executor {self.name}: joining goals failed: {traceback.format_exc()}')
            return []
        for job in joining:
            job.executor = self.name
        self.running = self.running + joining
        return [job for job in joining if not self._ended_before_start(job)]

    def _ended_before_start(self, job):
        """End ``job`` if it was canceled or is refused on leaving the queue; return True."""
        if job.cancel_event.is_set() and job.cancel_reason == 'shutdown':
            job.finish(JobResult(status=status.FAILED, message='server shut down before start',
                                 stop_phase='queue', error_code=status.ERROR_SHUTDOWN))
            return True
        if job.cancel_event.is_set():
            job.finish(JobResult(status=status.CANCELED, message='canceled before start',
                                 stop_phase='queue'))
            return True
        refused = self.on_dequeue(job)
        if refused is not None:
            job.finish(refused)
            return True
        return False


def _finish(job, result):
    job.finish(result)
