"""Executors: a worker thread that takes goals from the queue and runs them with a JobRunner.

One goal at a time per executor. Before a goal runs, ``on_dequeue`` may end it instead (it
was canceled meanwhile, or admission finds it can no longer fit after waiting).
"""

import threading
import traceback

from timebill_ros.server import status
from timebill_ros.server.goals import JobResult


class Executor:
    """A worker thread running jobs from ``queue`` with ``runner`` (a JobRunner).

    on_dequeue(job) -> JobResult or None: a result ends the job without running it.
    after_job(job): called after each job, on this thread (persistence, bookkeeping).
    log: one line of text per fault. accept(job) -> bool: which queued jobs this executor
    may take (None: all).
    """

    def __init__(self, name, queue, runner, on_dequeue=None, after_job=None, log=print,
                 accept=None):
        self.name = name
        self.accept = accept
        self.queue = queue
        self.runner = runner
        self.on_dequeue = on_dequeue or (lambda job: None)
        self.after_job = after_job or (lambda job: None)
        self.log = log
        self.current = None
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
    def alive(self):
        """Return True while the worker thread runs."""
        return self._thread.is_alive()

    def _loop(self):
        bind = getattr(self.runner.engine, 'bind_thread', None)
        if bind is not None:
            bind()  # this engine's torch threads on this thread
        while not self._stop.is_set():
            try:
                job = self.queue.pop(timeout_s=0.5, accept=self.accept)
            except Exception:  # the queue's policy failed: log, keep the thread
                self.log(f'executor {self.name}: taking a goal failed: {traceback.format_exc()}')
                self._stop.wait(0.1)
                continue
            if job is None:
                continue
            self.current = job
            job.executor = self.name
            try:
                self._run_one(job)
            except Exception as exc:  # never let one goal end the thread that runs them all
                self.log(f'executor {self.name}: goal {job.goal_id} failed: '
                         f'{traceback.format_exc()}')
                job.finish(JobResult(status=status.FAILED,
                                     message=f'internal error: {type(exc).__name__}: {exc}'))
            finally:
                self.current = None
            try:
                self.after_job(job)
            except Exception:
                self.log(f'executor {self.name}: after-job hook failed: '
                         f'{traceback.format_exc()}')

    def _run_one(self, job):
        if job.cancel_event.is_set():
            job.finish(JobResult(status=status.CANCELED, message='canceled before start',
                                 stop_phase='queue'))
            return
        refused = self.on_dequeue(job)
        if refused is not None:
            job.finish(refused)
            return
        job.finish(self.runner.run(job))
