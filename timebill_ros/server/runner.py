"""One goal through the TimeBill pipeline on one engine, under its deadline in every phase.

prefill in chunks sized from the time model (the length predictor beside it on a CPU thread)
-> wait for N^ (with a prefill readout: read N^ from the prefill's pooled states) -> alpha*
for the time actually left (Eq. 11, the corrected model at its DECIDE bound) -> evict ->
decode. Cancel and the Kill / Partial deadline are checked before every decoder layer, between
prefill chunks, while waiting for the predictor and between eviction layers; Kill and Partial
goals also stop as soon as the time model says they can no longer finish, so their compute
goes to the next goal. Every measured phase updates the online time model.
"""

import time

from timebill_ros.engine import stopping
from timebill_ros.server import status
from timebill_ros.server.goal_run import GoalRun
from timebill_ros.server.goals import JobResult
from timebill_ros.server.prediction import PredictorThread
from timebill_ros.timing.batch import BatchScale
from timebill_ros.timing.online import EXPECTED
WARM_UP_TOKENS = 256    # the start-up warm-up goal: prompt tokens, decoding steps, alpha
WARM_UP_STEPS = 16
WARM_UP_ALPHA = 0.5


class JobRunner:
    """Runs jobs on an engine and returns their JobResult (never raises for job faults).

    engine: LlmEngine. predictor: LengthPredictor. time_model: timing.online.TimeModel.
    clock: monotonic seconds (the service's). batch_step: the engine's batched-step fit
    (timing.batch.BatchStepCoefficients) when the calibration has one, else None (a goal
    in a batch of B then budgets B x its step alone). readout: a
    predictors.prefill_readout.PrefillReadout giving N^ after the prefill (the predictor
    then does not run beside it), or None. recheck(job) -> JobResult or None: admission
    again, for a goal that finds less of its prompt in the prefix store than it was
    admitted with (a result ends it unrun); None: no re-check. mask_step_s: seconds a
    json_schema goal's token mask adds to each decoding step (engine/grammar.py).
    """

    def __init__(self, engine, predictor, time_model, server_config, clock=time.monotonic,
                 batch_step=None, readout=None, recheck=None, mask_step_s=0.0):
        self.engine = engine
        self.recheck = recheck
        self.mask_step_s = mask_step_s
        self.predictor = predictor
        self.readout = readout
        self.time_model = time_model
        self.config = server_config
        self.clock = clock
        self.batch_scale = BatchScale(batch_step)
        self._predictions = PredictorThread('timebill-predict', clock,
                                            server_config.budget.upper_quantile)

    def timed_now(self) -> float:
        """Return the clock once the engine's queued work has run, seconds (a timing read).

        Every read that opens or closes a measured time of the engine's work (the online
        time model's observations, a result's execution time and kill latency) takes it: on
        a GPU the work is queued and a bare read would time its launch (engine.synchronize;
        nothing to wait for on the CPU). Deadline checks and feedback read ``clock``.
        """
        self.engine.synchronize()
        return self.clock()

    def close(self):
        """Stop the predictor thread."""
        self.predictor.abort()
        self._predictions.close()

    def submit_prediction(self, prompt, input_ids, n_max):
        """Start the length predictor on its thread; return the future."""
        return self._predictions.submit(self.predictor, prompt, input_ids, n_max)

    def run(self, job) -> JobResult:
        """Run ``job`` to a terminal JobResult."""
        goal = self._start(job)
        try:
            goal.execute()
        except Exception as exc:  # a model or predictor fault ends this goal only
            goal.failed(exc)
        return goal.ended()

    def run_batch(self, jobs, finish, more=None, capacity=None) -> None:
        """Run ``jobs`` as one decoding batch; ``finish(job, result)`` as each one ends.

        Each goal is prefilled (predictor beside it), budgeted and evicted in turn, as
        :meth:`run` does, with alpha* from the time model scaled to the batch's step
        (timing.batch.step_scale); then the prepared goals decode together, each under its
        own stop criteria, and leave the batch when they end. A fault in one goal's
        preparation ends that goal; a fault in a shared step ends every goal still in it.
        more(room, members) -> jobs: continuous batching, goals that join between steps (at
        most ``room``; ``members`` the jobs decoding); each joiner's prefill pauses the
        batch. capacity: the most goals at once (C_f); with ``more`` the step scale assumes
        a full batch, since goals may join after a goal's alpha* was chosen.
        """
        size = len(jobs) if more is None else max(len(jobs), capacity or len(jobs))
        scale = self.batch_scale.scale(size)
        batch, rows = self.engine.new_batch(), {}
        self._prepare_into(batch, rows, jobs, scale, finish, size)
        while rows:
            if more is not None and len(rows) < size:
                joining = more(size - len(rows), [goal.job for goal in rows.values()])
                if joining:
                    self._prepare_into(batch, rows, joining, scale, finish, size)
                    continue
            for goal in rows.values():
                goal.result.batch_size = max(goal.result.batch_size, len(rows))
            try:
                ended = batch.step()
            except Exception as exc:  # a shared step failed: every goal in it fails
                for goal in rows.values():
                    goal.failed(exc)
                    finish(goal.job, goal.ended())
                return
            for row_id, out in ended:
                goal = rows.pop(row_id)
                try:
                    goal.decoded(out)
                except Exception as exc:
                    goal.failed(exc)
                finish(goal.job, goal.ended())

    def _prepare_into(self, batch, rows, jobs, scale, finish, size):
        """Prepare ``jobs`` in turn and join them to ``batch`` (rows: row id -> GoalRun).

        scale: their step scale, that of a batch of ``size`` goals.
        """
        # A goal's decoding starts once the goals after it are prefilled: its budget says so.
        try:
            prefills_s = [self.time_model.prefill_s(job.n_x, EXPECTED, n_cached=job.n_cached)
                          for job in jobs]
        except Exception as exc:  # the time model failed: none of them can be budgeted
            for job in jobs:
                goal = self._start(job, batch_size=len(jobs))
                goal.failed(exc)
                finish(job, goal.ended())
            return
        for index, job in enumerate(jobs):
            goal = self._start(job, batch_size=len(jobs), step_scale=scale,
                               wait_s=sum(prefills_s[index + 1:]), scale_size=size)
            try:
                prepared = goal.prepare()
                if prepared is not None:
                    rows[goal.join(batch, *prepared)] = goal
                    continue
            except Exception as exc:
                goal.failed(exc)
            finish(job, goal.ended())

    def _start(self, job, batch_size=1, step_scale=1.0, wait_s=0.0, scale_size=1):
        job.started_s = self.timed_now()
        result = JobResult(status=status.FAILED, message='', prompt_tokens=job.n_x,
                           queue_time_s=job.started_s - job.received_s, batch_size=batch_size)
        return GoalRun(self, job, result, step_scale, wait_s, scale_size)

    def warm_up(self, n_x=WARM_UP_TOKENS, steps=WARM_UP_STEPS, alpha=WARM_UP_ALPHA):
        """Run one synthetic goal as goals run and feed its times to the time model.

        The prefill runs with the predictor beside it, then an eviction at ``alpha`` and
        ``steps`` decoding steps with the text streamed as for goals: the speed factors then
        start from this moment's machine (a slow-down at once, a speed-up only in part).
        """
        model, engine = self.time_model, self.engine
        ids = engine.random_ids(n_x)
        future = None if self.readout else self.submit_prediction('', ids, steps + 1)
        state = engine.prefill(ids, stopping.StopCriteria())
        model.observe_prefill(n_x, state.prefill_s, state.n_chunks)
        try:
            if future is None:
                self.readout.predict_bounds(state.pooled, steps + 1)
            else:
                done = future.result(timeout=60.0)
                model.observe_predict(n_x, done.end_s - done.start_s)
        except Exception:  # a broken predictor is reported by the goals that use it
            pass
        start = self.timed_now()
        n_kv = engine.evict(state, alpha)
        if n_kv < n_x:
            model.observe_evict(n_x, self.timed_now() - start)
        timer = stopping.StepTimer(self.clock, sync=engine.synchronize)
        # Decoded as goals are: the text streamed at the feedback cadence.
        engine.decode(state, steps + 1, stopping.StopCriteria([timer]),
                      on_tokens=lambda n_generated, text: None,
                      feedback_every=self.config.engine.feedback_every_tokens)
        durations = timer.step_durations_s()
        model.observe_decode(n_kv, len(durations), sum(durations))
