"""A goal inside the server, from admission to its one terminal result."""

import dataclasses
import threading
import time
import traceback
from typing import Callable, List, Optional

from timebill_ros.server import status
from timebill_ros.server.goals import Feedback, GoalRequest, JobResult


@dataclasses.dataclass(eq=False)
class Job:
    """An admitted goal.

    received_s / deadline_s / started_s: service-clock seconds. n_max: N_max, tokens.
    input_ids: the chat-templated prompt, N_x = len(input_ids) tokens.
    min_time_s: the least time the goal can take (admission's estimate at receipt), seconds.
    infeasible: admission found it could not fit its budget (Skip-Next goals still run);
    admission_note says so with the numbers.
    expires_s: when a queued job is re-checked by the reaper (service-clock seconds): the
    last moment it can start and still finish (Kill, Partial), or its deadline.
    log: one line of text when ``on_done`` raises (the fault is contained here).
    predicted_tokens: u_J, the length predictor's N^ (tokens) once known while queued (the
    run reuses it); prediction: that prediction while it runs (a Future of
    (n_hat, start_s, end_s)). estimated_time_s: t^_J, the time model's execution time for
    ``uncertainty_tokens`` (seconds), what slack-based scheduler policies use.
    executor: the name of the executor that took the goal ('' while queued).
    schedule_s: scheduling overhead spent on this goal, seconds (wall time, perf_counter):
    the policy's choice that picked it. The admission-time length prediction is not in it:
    it is the goal's t_Predict (the run reuses it, so it replaces the beside-the-prefill
    prediction rather than adding one).
    n_cached: prompt tokens the prefix store holds for it (tokens, found at admission and
    looked up again when it starts): what its prefill estimates count as copied.
    sampling: its engine.sampling.SamplingConfig (None: greedy).
    grammar: its compiled ``json_schema`` (engine/grammar.py), or None.
    """

    request: GoalRequest
    goal_id: str
    received_s: float
    deadline_s: float
    policy: object
    n_max: int
    input_ids: List[int]
    on_feedback: Callable[[Feedback], None]
    on_done: Callable[[JobResult], None]
    cancel_event: threading.Event = dataclasses.field(default_factory=threading.Event)
    started_s: Optional[float] = None
    min_time_s: float = 0.0
    infeasible: bool = False
    admission_note: str = ''
    expires_s: Optional[float] = None
    cancel_reason: str = ''
    predicted_tokens: Optional[int] = None
    prediction: Optional[object] = None
    estimated_time_s: float = 0.0
    executor: str = ''
    schedule_s: float = 0.0
    n_cached: int = 0
    sampling: Optional[object] = None
    grammar: Optional[object] = None
    clock: Callable[[], float] = time.monotonic
    log: Callable[[str], None] = print
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    _result: Optional[JobResult] = None

    @property
    def budget_s(self) -> float:
        """Return T, seconds from receipt to deadline."""
        return self.deadline_s - self.received_s

    @property
    def n_x(self) -> int:
        """Return N_x, prompt tokens."""
        return len(self.input_ids)

    @property
    def uncertainty_tokens(self) -> int:
        """Return u_J, tokens: the predicted response length, or N_max while unknown."""
        return self.n_max if self.predicted_tokens is None else self.predicted_tokens

    @property
    def done(self) -> bool:
        """Return True once the job has its terminal result."""
        return self._result is not None

    def cancel(self, reason: str = 'client') -> None:
        """Ask the job to stop; reason is 'client' or 'shutdown'."""
        if not self.cancel_reason:
            self.cancel_reason = reason
        self.cancel_event.set()

    def finish(self, result: JobResult) -> bool:
        """Deliver the terminal result exactly once; return False if it already had one."""
        with self._lock:
            if self._result is not None:
                return False
            result.goal_id = self.goal_id
            result.overrun_policy = self.policy.name
            result.budget_s = self.budget_s
            result.prompt_tokens = result.prompt_tokens or len(self.input_ids)
            result.min_time_s = result.min_time_s or self.min_time_s
            result.infeasible = result.infeasible or self.infeasible
            result.executor = result.executor or self.executor
            if self.predicted_tokens is not None:
                result.uncertainty_tokens = self.predicted_tokens
            if not result.total_time_s:
                result.total_time_s = self.clock() - self.received_s
            if self.started_s is None:  # ended while queued: all of it was queue time
                result.queue_time_s = result.total_time_s
            result.schedule_time_s = self.schedule_s
            if not result.finish_reason:
                result.finish_reason = (status.FINISH_SHUTDOWN if self.cancel_reason == 'shutdown'
                                        and result.status == status.FAILED
                                        else status.FINISH_OF_STATUS.get(result.status, ''))
            if not result.error_code:
                result.error_code = _error_code_of(result, self.cancel_reason)
            self._result = result
        try:
            self.on_done(result)
        except Exception:  # a fault in delivery must not reach the thread that finished it
            self.log(f'goal {self.goal_id}: on_done failed: {traceback.format_exc()}')
        return True


def _error_code_of(result, cancel_reason):
    """Return the error code a result implies when its maker recorded none (status.ERROR_*)."""
    if result.status == status.FAILED and cancel_reason == 'shutdown':
        return status.ERROR_SHUTDOWN
    if result.status == status.REJECTED:
        return status.ERROR_INFEASIBLE if result.infeasible else status.ERROR_INVALID_OPTION
    return status.ERROR_OF_STATUS.get(result.status, status.ERROR_NONE)
