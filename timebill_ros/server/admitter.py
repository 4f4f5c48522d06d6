"""Admission: a goal request becomes a Job, or a refusal that says why.

The checks run in order of cost: the server's state, the request's fields, room in the
queue, the schema compile and the tokenizer, then the time model (admission policy). The
same time check runs again when the goal leaves the queue and when the reaper finds it
expired (:meth:`Admitter.recheck`).
"""

from timebill_ros.server import goals, overrun, status
from timebill_ros.server.admission import make_admission
from timebill_ros.server.goals import GoalRejected, JobResult
from timebill_ros.server.job import Job
from timebill_ros.server.scheduler import QueueFull
from timebill_ros.timing.online import EXPECTED


class GoalInfeasible(GoalRejected):
    """Admission found that a goal cannot fit its budget; min_time_s: its least time, s."""

    error_code = status.ERROR_INFEASIBLE

    def __init__(self, message, min_time_s, n_x):
        super().__init__(message)
        self.min_time_s = min_time_s
        self.n_x = n_x


def rejecting(queue_call, *args):
    """Call a JobQueue method; a full or closed queue becomes GoalRejected (its message)."""
    try:
        return queue_call(*args)
    except QueueFull as exc:
        raise GoalRejected(str(exc), error_code=status.ERROR_QUEUE_FULL) from exc
    except RuntimeError as exc:  # closed: the service shuts down
        raise GoalRejected(str(exc), error_code=status.ERROR_SHUTDOWN) from exc


class Admitter:
    """Checks a goal request and builds its Job; the admission policy's time check.

    config: ServerConfig. engine: encodes prompts, matches prefixes, compiles schemas and
    says its context (tokens). time_model: the primary's (timing.online.TimeModel). queue:
    the JobQueue whose room is checked before the costly steps. clock: monotonic seconds.
    """

    def __init__(self, config, engine, time_model, queue, clock):
        self.config = config
        self.engine = engine
        self.time_model = time_model
        self.queue = queue
        self.clock = clock
        self.admission = make_admission(config.admission.policy, time_model)

    def job_of(self, request, goal_id, received_s, on_feedback, on_done, log):
        """Return the admitted Job of ``request``; GoalRejected (or GoalInfeasible) if not.

        received_s: when the request came, s; the callbacks and ``log`` go to the Job.
        """
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
        rejecting(self.queue.check_room)
        grammar = self.compile_schema(request, deadline_s)
        input_ids = self._encode(request, messages)
        # The answer cannot outgrow the context: N_x + N_max <= context tokens.
        n_max = min(n_max, self.engine.context_tokens - len(input_ids))
        job = Job(request=request, goal_id=goal_id, received_s=received_s,
                  deadline_s=deadline_s, policy=policy, n_max=n_max, input_ids=input_ids,
                  on_feedback=on_feedback, on_done=on_done, clock=self.clock, log=log,
                  n_cached=self.engine.match_prefix(input_ids).n_tokens, sampling=sampling,
                  grammar=grammar)
        verdict = self.admission.check(job, self.clock())
        if not verdict.admit:
            raise GoalInfeasible(verdict.message, verdict.min_time_s, job.n_x)
        self._apply(job, verdict)
        job.estimated_time_s = self.estimated_time_s(job)
        return job

    def recheck(self, job, now_s=None):
        """Check a queued goal's time again at ``now_s`` (None: the clock).

        Return None when it still fits (its expiry moves), else its REJECTED result.
        """
        verdict = self.admission.check(job, self.clock() if now_s is None else now_s,
                                       queued=True)
        if verdict.admit:
            self._apply(job, verdict)
            return None
        return JobResult(status=status.REJECTED, message=verdict.message, infeasible=True,
                         min_time_s=verdict.min_time_s, stop_phase='queue',
                         error_code=status.ERROR_INFEASIBLE)

    def _apply(self, job, verdict):
        """Record an admitting verdict on the job: least time, note, queue expiry."""
        job.min_time_s = verdict.min_time_s
        if verdict.infeasible and not job.infeasible:  # the first finding says the most
            job.infeasible = True
            job.admission_note = verdict.message
        job.expires_s = (job.deadline_s if self.admission.name == 'none' else
                         job.policy.queue_expiry_s(job.deadline_s, verdict.min_time_s))

    def estimated_time_s(self, job):
        """Return t^_J, seconds: prefill plus u_J decoding steps at the EXPECTED bound."""
        model, n_x = self.time_model, job.n_x
        steps = max(job.uncertainty_tokens - 1, 0)
        return (model.prefill_s(n_x, EXPECTED, n_cached=job.n_cached)
                + steps * model.step_s(n_x + steps // 2, EXPECTED))

    def precompile(self, request, received_s=None) -> None:
        """Compile a goal's json_schema ahead of admission; never raises.

        The node calls it before taking its slot lock, so a slow compile holds no other
        goal's submit; submit then finds the grammar cached (or the refusal, at once).
        """
        received_s = self.clock() if received_s is None else received_s
        try:
            goals.check_schema(request, self.config.queue.max_schema_chars)
            self.compile_schema(request, goals.resolve_deadline(request, received_s))
        except Exception:  # submit refuses the goal with the reason
            pass

    def compile_schema(self, request, deadline_s):
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
        """Return the prompt's token ids; GoalRejected when it cannot be tokenized or fit."""
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
