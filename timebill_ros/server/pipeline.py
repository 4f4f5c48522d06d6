"""The goal pipeline: one job's run on a backend, the same steps on every backend.

prepare (the prompt's cached head, N^ where it is needed, the budget's knob for the time
left: alpha* locally, max_tokens on a remote engine) -> run (evict and decode, or send and
stream) -> the one terminal result (outcome.py). A backend's run subclasses
:class:`GoalPipeline` with its :meth:`~GoalPipeline.prepare` and :meth:`~GoalPipeline.run`:
server/goal_run.py (local), server/backends/remote.py (an engine behind an HTTP API). The
wait for a prediction is shared too (prediction.await_prediction).
"""

import abc

from timebill_ros.server import outcome
from timebill_ros.server.goals import Feedback


class GoalPipeline(abc.ABC):
    """The state of one job while it runs: its runner, result, phase and clock.

    runner: the backend's runner (``clock``, ``time_model``, ``timed_now()``). job: the
    Job; result: its JobResult, filled as the run goes.
    """

    def __init__(self, runner, job, result):
        self.runner, self.job, self.result = runner, job, result
        self.clock = runner.clock
        self.model = runner.time_model
        self.phase = 'prefill'

    def execute(self):
        """Run the job alone: prepare, then run what was prepared (nothing if it ended)."""
        prepared = self.prepare()
        if prepared is not None:
            self.run(*prepared)

    @abc.abstractmethod
    def prepare(self):
        """Return what :meth:`run` takes (a tuple), or None when the job already ended."""

    @abc.abstractmethod
    def run(self, *prepared):
        """Produce the answer and fill the result."""

    def failed(self, exc):
        """Record a fault (model, predictor, engine) as this job's FAILED result."""
        outcome.failed(self.result, exc, self.phase)

    def ended(self):
        """Stamp the run's end on the result and return it."""
        end, job, result = self.runner.timed_now(), self.job, self.result
        result.execution_time_s = end - job.started_s
        result.total_time_s = end - job.received_s
        return result

    def _feedback(self, phase, tokens=0, text='', alpha=0.0):
        """Send one feedback of ``phase``: tokens so far, their new text, alpha now."""
        self.job.on_feedback(Feedback(phase=phase, tokens_generated=tokens, text=text,
                                      elapsed_s=self.clock() - self.job.received_s,
                                      eviction_ratio=alpha))

    def _stopped(self, reason):
        """Fill the result of a job stopped by ``reason`` during ``self.phase``."""
        now = self.runner.timed_now()  # kill latency: once the stopped work has drained
        outcome.stopped(self.job, self.result, reason, self.phase, now)
