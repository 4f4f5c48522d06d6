"""One goal through the TimeBill pipeline on one engine, under its deadline in every phase.

prefill in chunks sized from the time model (the length predictor beside it on a CPU thread)
-> wait for N^ (with a prefill readout: read N^ from the prefill's pooled states) -> alpha*
for the time actually left (Eq. 11, the corrected model at its DECIDE bound) -> evict ->
decode. Cancel and the Kill / Partial deadline are checked before every decoder layer, between
prefill chunks, while waiting for the predictor and between eviction layers; Kill and Partial
goals also stop as soon as the time model says they can no longer finish, so their compute
goes to the next goal. Every measured phase updates the online time model.
"""

import concurrent.futures
import dataclasses
import itertools
import time
from typing import Optional

from timebill_ros.engine import stopping
from timebill_ros.engine import GenerationStopped
from timebill_ros.engine.grammar import CLOSE_RESERVE_TOKENS
from timebill_ros.engine.sampling import Sampler
from timebill_ros.server import status
from timebill_ros.server.goals import Feedback, JobResult
from timebill_ros.timing.batch import BatchScale, ScaledSteps
from timebill_ros.timing.budget import decide_remaining
from timebill_ros.timing.online import DECIDE, EXPECTED, LEAST, WORST

# The finish_reason of each engine stop reason, and how a COMPLETED message says it.
FINISH_OF_STOP = {
    stopping.EOS: status.FINISH_EOS, stopping.MAX_TOKENS: status.FINISH_LENGTH,
    stopping.STOP_STRING: status.FINISH_STOP, stopping.REPETITION: status.FINISH_REPETITION,
    stopping.DEADLINE: status.FINISH_DEADLINE, stopping.CANNOT_FINISH: status.FINISH_DEADLINE,
    stopping.CANCELED: status.FINISH_CANCELED}
STOP_WORDS = {stopping.EOS: 'end of answer', stopping.STOP_STRING: 'stop string',
              stopping.REPETITION: 'the answer repeated itself; cut where the loop began'}
POLL_S = 0.005          # the predictor wait re-checks cancel and the deadline this often
MIN_CHUNK_TOKENS = 16   # chunks never shrink below this (per-call overhead would dominate)
WARM_UP_TOKENS = 256    # the start-up warm-up goal: prompt tokens, decoding steps, alpha
WARM_UP_STEPS = 16
WARM_UP_ALPHA = 0.5


def _planned(sizes, first=0):
    """Return a chunk plan (engine.prefill's ``chunk_plan``) following ``sizes``, tokens.

    first: the position of the first chunk (the tokens copied from the prefix store).
    """
    by_begin = dict(zip(itertools.accumulate([first] + sizes[:-1]), sizes))
    return lambda begin, n_tokens: by_begin.get(begin, MIN_CHUNK_TOKENS)


def chunk_sizes(model, engine_config, n_layers, n_x, n_cached=0):
    """Return a prefill's chunk sizes, tokens: one decoder layer takes at most the bound.

    model: the TimeModel; engine_config: the ``engine`` group; n_layers: decoder layers;
    n_x: prompt tokens, the first ``n_cached`` of them copied from the prefix store.
    The bound is ``engine.stop_bound_s`` or, when 0, one decoding step at this prompt's
    length; a cancel or deadline then lands within about one step (checks run before
    every layer). Chunk and step times are the time model's EXPECTED ones: both scale
    with the machine's speed, and a pessimistic chunk estimate would only shrink the
    chunks, which costs (each forward pass pays an overhead; see TimeModel.prefill_s).
    The largest such chunk up to ``engine.prefill_chunk_tokens`` is taken (binary
    search: the time grows with size).
    """
    allowed_s = (engine_config.stop_bound_s or model.step_s(n_x, EXPECTED)) * n_layers
    sizes, begin = [], n_cached
    while begin < n_x:
        low, high = MIN_CHUNK_TOKENS, max(MIN_CHUNK_TOKENS, engine_config.prefill_chunk_tokens)
        while low < high:
            mid = (low + high + 1) // 2
            if model.chunk_s(begin, mid, EXPECTED) <= allowed_s:
                low = mid
            else:
                high = mid - 1
        sizes.append(min(low, n_x - begin))
        begin += sizes[-1]
    return sizes


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One predictor call: N^ and N^_q (None: not asked or not known), tokens; its times, s."""

    n_hat: int
    n_upper: Optional[int]
    start_s: float
    end_s: float


def timed_predict(predictor, prompt, input_ids, n_max, clock, upper_quantile=0.0):
    """Return the :class:`Prediction` of one predictor call, service-clock seconds.

    upper_quantile: q > 0 also asks for N^_q (``budget.upper_quantile``), from the same run.
    """
    start = clock()
    if upper_quantile > 0:
        n_hat, n_upper = predictor.predict_bounds(prompt, input_ids, n_max, upper_quantile)
    else:
        n_hat, n_upper = predictor.predict(prompt, input_ids, n_max), None
    return Prediction(int(n_hat), None if n_upper is None else int(n_upper), start, clock())


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
        self._predict_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix='timebill-predict')

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
        self._predict_pool.shutdown(wait=True, cancel_futures=True)

    def submit_prediction(self, prompt, input_ids, n_max):
        """Start the length predictor on its thread; return the future."""
        return self._predict_pool.submit(timed_predict, self.predictor, prompt, input_ids,
                                         n_max, self.clock,
                                         self.config.budget.upper_quantile)

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
        """Prepare ``jobs`` in turn and join them to ``batch`` (rows: row id -> _GoalRun).

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
        return _GoalRun(self, job, result, step_scale, wait_s, scale_size)

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


class _GoalRun:
    """The state of one goal while it runs (phase, criteria, timings).

    step_scale: the decoding step of the batch it runs in over a goal's step alone (1.0
    alone); the budget math and the early stop use the step so scaled. wait_s: expected
    seconds between its eviction and its first batched step (the prefills of the goals
    after it in the batch); alpha* and t^_WCET count them. scale_size: the batch size
    step_scale is for (what the batch scale learns this goal's measured steps as).
    """

    def __init__(self, runner, job, result, step_scale=1.0, wait_s=0.0, scale_size=1):
        self.runner = runner
        self.engine = runner.engine
        self.model = runner.time_model
        self.step_scale = step_scale
        self.wait_s = wait_s
        # A schema's token mask adds its cost to every step (measured at start-up).
        self.mask_scale = 1.0
        if job.grammar is not None and runner.mask_step_s > 0:
            self.mask_scale = 1.0 + runner.mask_step_s / max(
                self.model.step_s(job.n_x, EXPECTED), 1e-6)
        scale = step_scale * self.mask_scale
        self.decode_model = self.model if scale == 1.0 else ScaledSteps(self.model, scale)
        self.scale_size = scale_size
        self.clock = runner.clock
        self.job = job
        self.result = result
        self.n_upper = None  # N^_q of the prediction, tokens (budget.upper_quantile)
        self.phase = 'prefill'
        self.interrupt = stopping.StopCriteria(
            [stopping.CancelStop(job.cancel_event)]
            + list(job.policy.stop_criteria(job.deadline_s, self.clock)))

    # --- the pipeline ------------------------------------------------------------------
    def execute(self):
        """Run the goal alone: prepare, then decode."""
        prepared = self.prepare()
        if prepared is not None:
            self._decode(*prepared)

    def prepare(self):
        """Prefill, predict, budget and evict; return (state, alpha) or None when it ended."""
        job, model, result = self.job, self.model, self.result
        prefix = self._find_prefix()
        if prefix is None:
            return None
        chunks = self._chunk_sizes()
        # u_J predicted while the goal waited is reused as N^ (its call may still run).
        readout = self.runner.readout
        prediction = job.prediction
        # Not started on the admission thread: it never runs (the goal predicts beside its
        # prefill); with a readout N^ comes from the prefill, a u_J call in flight just ends.
        if prediction is not None and (prediction.cancel() or readout is not None):
            prediction = None
        early = prediction is not None
        # t^_WCET's head is predicted before anything runs, so the WCET is a true forecast.
        if readout is not None:
            overhang_s = readout.time_s
        else:
            overhang_s = (0.0 if early and prediction.done()
                          else model.overhang_s(job.n_x, WORST, job.n_cached))
        self.wcet_head_s = (model.prefill_s(job.n_x, WORST, len(chunks), job.n_cached)
                            + overhang_s)
        self._feedback(status.PHASE_PREFILL)
        if not early and readout is None:
            prediction = self.runner.submit_prediction(job.request.prompt, job.input_ids,
                                                       job.n_max)
        try:
            state = self.engine.prefill(job.input_ids, self._prefill_stop(),
                                        chunk_plan=_planned(chunks, job.n_cached),
                                        interrupt=self.interrupt, prefix=prefix,
                                        store=self.engine.prefix_store)
        except GenerationStopped as stop:
            if prediction is not None:
                self._drop(prediction)
            self._stopped(stop.reason)
            return
        prefill_end = self.clock()
        result.prefill_time_s = state.prefill_s
        result.cached_tokens = state.n_cached
        model.observe_prefill(job.n_x, state.prefill_s, state.n_chunks, state.n_cached)
        self.phase = 'predictor'
        if readout is not None:
            n_hat = self._read_out(readout, state)
        else:
            n_hat = self._await_prediction(prediction, prefill_end, early)
        if n_hat is None:
            return None
        decision = self._decide(n_hat)
        self.phase = 'eviction'
        if not self._evict(state, decision.alpha):
            return None
        self.phase = 'decode'
        return state, decision.alpha

    def _find_prefix(self):
        """Return the prefix store's match for the prompt, or None when the goal ended.

        The goal was admitted counting ``job.n_cached`` tokens (the primary engine's store at
        admission); this engine's store may hold less now (dropped to make room, or another
        executor's store): the goal is then checked again as admission would.
        """
        job = self.job
        match = self.engine.match_prefix(job.input_ids, count=False)
        admitted_with = job.n_cached
        job.n_cached = match.n_tokens
        if match.n_tokens < admitted_with and self.runner.recheck is not None:
            refused = self.runner.recheck(job)
            if refused is not None:
                result = self.result
                result.status, result.infeasible = refused.status, refused.infeasible
                result.error_code = refused.error_code
                result.min_time_s, result.stop_phase = refused.min_time_s, 'prefill'
                result.message = (f'{refused.message} (its cached prompt head went from '
                                  f'{admitted_with} to {match.n_tokens} tokens)')
                return None
        return match

    def failed(self, exc):
        """Record a model or predictor fault as this goal's FAILED result."""
        result = self.result
        result.status = status.FAILED
        result.message = f'engine error: {type(exc).__name__}: {exc}'
        result.response = ''
        result.stop_phase = self.phase

    def ended(self):
        """Stamp the run's end on the result and return it."""
        end, job, result = self.runner.timed_now(), self.job, self.result
        result.execution_time_s = end - job.started_s
        result.total_time_s = end - job.received_s
        return result

    def _feedback(self, phase, tokens=0, text='', alpha=0.0):
        self.job.on_feedback(Feedback(phase=phase, tokens_generated=tokens, text=text,
                                      elapsed_s=self.clock() - self.job.received_s,
                                      eviction_ratio=alpha))

    def _prefill_stop(self):
        """Interrupts, plus (Kill / Partial) stop once the rest of the prefill cannot fit."""
        criteria = list(self.interrupt.criteria)
        if self.job.policy.stops_early:
            n_x, model = self.job.n_x, self.decode_model

            def least_rest_s(n_done):
                return model.prefill_rest_s(n_done, n_x, LEAST) + model.step_s(n_x, LEAST)

            criteria.append(stopping.PrefillCannotFinish(self.job.deadline_s, least_rest_s,
                                                         self.clock))
        return stopping.StopCriteria(criteria)

    def _chunk_sizes(self):
        """Return the prefill's chunk sizes, tokens (:func:`chunk_sizes`)."""
        return chunk_sizes(self.model, self.runner.config.engine, self.engine.n_layers,
                           self.job.n_x, self.job.n_cached)

    def _drop(self, future):
        """Give up a prediction: unstarted, it never runs; running, the predictor aborts.

        The predictor's abort ends its call in flight; on the admission thread that may be
        another waiting goal's u_J, which then stays N_max until that goal runs and predicts
        again (harmless, and only when both calls overlap).
        """
        if not future.cancel() and not future.done():
            self.runner.predictor.abort()

    def _await_prediction(self, future, prefill_end, early=False):
        """Return N^ (the fallback N_max when late or broken), or None when the goal stopped.

        The wait re-checks cancel, the deadline and (Kill / Partial) whether one decoding
        step still fits, every POLL_S seconds; it gives up after predictor.timeout_s.
        early: the prediction was started at admission (u_J); its time is not a
        beside-the-prefill t_Predict, so the time model does not learn from it.
        """
        job, result = self.job, self.result
        limit = prefill_end + self.runner.config.predictor.timeout_s
        predictor = self.runner.predictor
        while True:
            reason = self.interrupt.check(0, None) or self._cannot_decode(0.0)
            if reason is not None:
                self._drop(future)
                self._stopped(reason)
                return None
            if self.clock() >= limit and not future.done():
                future.cancel()
                result.predictor = 'fallback (predictor late)'
                break
            try:
                done = future.result(timeout=max(0.0, min(POLL_S, limit - self.clock())))
            except concurrent.futures.TimeoutError:
                continue
            except Exception as exc:
                result.predictor = f'fallback (predictor error: {type(exc).__name__}: {exc})'
                break
            n_hat = done.n_hat
            if 0 <= n_hat <= job.n_max:
                result.predictor = predictor.name + (' (at admission)' if early else '')
                result.predict_time_s = done.end_s - done.start_s
                if not early:
                    self.model.observe_predict(job.n_x, done.end_s - done.start_s)
                self._keep_upper(n_hat, done.n_upper)
                return n_hat
            result.predictor = (f'fallback (predictor error: predicted {n_hat} tokens, '
                                f'outside [0, {job.n_max}])')
            break
        result.predict_time_s = self.clock() - prefill_end
        return job.n_max

    def _read_out(self, readout, state):
        """Return N^ read from the prefill's pooled states (the fallback N_max if it fails).

        Also sets N^_q (``budget.upper_quantile``). About a millisecond: no interrupt check.
        """
        job, result = self.job, self.result
        start = self.clock()
        try:
            n_hat, n_upper = readout.predict_bounds(state.pooled, job.n_max,
                                                    self.runner.config.budget.upper_quantile)
            if not 0 <= n_hat <= job.n_max:
                raise ValueError(f'predicted {n_hat} tokens, outside [0, {job.n_max}]')
            result.predictor = readout.name
        except Exception as exc:
            result.predictor = f'fallback (readout error: {type(exc).__name__}: {exc})'
            n_hat, n_upper = job.n_max, None
        result.predict_time_s = self.clock() - start
        self._keep_upper(n_hat, n_upper)
        return n_hat

    def _keep_upper(self, n_hat, n_upper):
        """Budget with N^_q when there is one and N^ <= N^_q <= N_max, tokens."""
        if n_upper is not None and n_hat <= n_upper <= self.job.n_max:
            self.n_upper = n_upper

    def _cannot_decode(self, extra_s):
        """Return CANNOT_FINISH when ``extra_s`` seconds plus one step no longer fit."""
        job = self.job
        if not job.policy.stops_early:
            return None
        need_s = extra_s + self.decode_model.step_s(job.n_x, LEAST)
        if self.clock() + need_s > job.deadline_s:
            return stopping.CANNOT_FINISH
        return None

    def _decide(self, n_hat):
        """Choose alpha* for the time left; fill the budget fields of the result."""
        job, cfg = self.job, self.runner.config.budget
        fixed = cfg.fixed_alpha if cfg.mode == 'fixed' else None
        # The two quality-keeping rules serve goals whose answer still arrives (Partial); a
        # late Kill answer is lost and a late Skip-Next one skips its successors, so those
        # take the paper's clamp to alpha_max (OverrunPolicy.clamps_alpha).
        late_kept = not job.policy.clamps_alpha
        decision = decide_remaining(self.decode_model,
                                    job.deadline_s - self.clock() - self.wait_s, job.n_x, n_hat,
                                    job.n_max, cfg.pessimistic_factor, cfg.alpha_max,
                                    fixed_alpha=fixed, n_upper=self.n_upper,
                                    bound=DECIDE, report_bound=WORST,
                                    fallback_bound=(EXPECTED if cfg.expected_fallback
                                                    and late_kept else None),
                                    keep_cache_when_hopeless=(cfg.keep_cache_when_hopeless
                                                              and late_kept))
        self.result.predicted_tokens = decision.n_hat
        self.result.pessimistic_tokens = decision.n_w
        self.result.eviction_ratio = decision.alpha
        self.result.predicted_wcet_s = self.wcet_head_s + self.wait_s + decision.remaining_s
        return decision

    def _evict(self, state, alpha):
        """Evict ``alpha`` of the prompt KV under the interrupts; return False if stopped."""
        if alpha <= 0:
            return True
        reason = self._cannot_decode(self.model.evict_s(self.job.n_x, LEAST))
        start = self.runner.timed_now()
        try:
            if reason is not None:
                raise GenerationStopped(reason)
            n_kv = self.engine.evict(state, alpha, interrupt=self.interrupt)
        except GenerationStopped as stop:
            self._stopped(stop.reason)
            return False
        if n_kv < state.n_x:
            self.model.observe_evict(state.n_x, self.runner.timed_now() - start)
        return True

    def _decode(self, state, alpha):
        """Decode alone on the engine, then record the outcome."""
        stop, on_tokens = self._decode_criteria(state, alpha)
        out = self.engine.decode(state, self.job.n_max, stop, on_tokens,
                                 self.runner.config.engine.feedback_every_tokens,
                                 interrupt=self.interrupt, sampler=self._sampler())
        self.decoded(out)

    def join(self, batch, state, alpha):
        """Join ``batch`` (engine DecodeBatch) under this goal's criteria; return the row id."""
        stop, on_tokens = self._decode_criteria(state, alpha)
        return batch.join(state, self.job.n_max, stop, on_tokens,
                          self.runner.config.engine.feedback_every_tokens,
                          interrupt=self.interrupt, sampler=self._sampler())

    def _sampler(self):
        """Return the goal's token picker (schema mask, Sampler), None: greedy (default)."""
        sampling, grammar = self.job.sampling, self.job.grammar
        inner = None
        if sampling is not None and not (sampling.greedy and sampling.repetition_penalty == 1):
            inner = Sampler(sampling)
        if grammar is not None:
            cfg = self.runner.config.engine
            n_max = self.job.n_max
            guard = (stopping.LoopGuard(cfg.loop_guard_max_period, cfg.loop_guard_min_repeats,
                                        cfg.loop_guard_min_span) if cfg.loop_guard else None)
            return self.engine.schemas.constrain(
                grammar, inner, close_after=n_max - min(CLOSE_RESERVE_TOKENS, n_max // 4),
                loop_guard=guard)
        return inner

    def _decode_criteria(self, state, alpha):
        """Return (stop criteria, feedback callback) of the decoding phase."""
        job, model = self.job, self.decode_model
        self.n_kv_first = n_kv_first = state.n_kv
        self.timer = stopping.StepTimer(self.clock, sync=self.engine.synchronize)
        # The timer first: check() returns at the first criterion that fires, and the
        # boundary after the last step must still be recorded.
        criteria = [self.timer, stopping.EosStop(self.engine.eos_token_ids),
                    stopping.MaxTokensStop(job.n_max)] + self._answer_criteria() \
            + list(self.interrupt.criteria)
        if job.policy.stops_early:
            # Kill stops only when the step surely cannot finish (LEAST); an anytime
            # answer stops before a step that might not (WORST): it must arrive in time.
            bound = WORST if job.policy.keeps_text_at_deadline else LEAST

            def next_step_s(n_generated):
                return model.step_s(n_kv_first + n_generated - 1, bound)

            criteria.append(stopping.NextStepCannotFinish(job.deadline_s, next_step_s,
                                                          self.clock))
        self._feedback(status.PHASE_DECODE, alpha=alpha)

        def on_tokens(n_generated, text):
            self._feedback(status.PHASE_DECODE, n_generated, text, alpha)

        return stopping.StopCriteria(criteria), on_tokens

    def _answer_criteria(self):
        """Return the criteria that end an answer by its content: stop strings, loop guard."""
        cfg, criteria = self.runner.config.engine, []
        if self.job.request.stop:
            tokenizer = self.engine.tokenizer
            criteria.append(stopping.StopStrings(
                self.job.request.stop,
                lambda tokens: tokenizer.decode(tokens, skip_special_tokens=True)))
        # Not under a schema: a cut would break the document; its maxItems / maxLength and
        # max_new_tokens bound it (docs/answers.md).
        if cfg.loop_guard and self.job.grammar is None:
            criteria.append(stopping.LoopGuard(cfg.loop_guard_max_period,
                                               cfg.loop_guard_min_repeats,
                                               cfg.loop_guard_min_span))
        return criteria

    def decoded(self, out):
        """Record the decoding phase's outcome ``out`` (engine DecodeResult)."""
        result = self.result
        # The model learns the step without the mask (its cost is the start-up figure).
        steps = [step / self.mask_scale for step in self.timer.step_durations_s()]
        if self.step_scale == 1.0:  # the online model learns a goal's step alone
            self.model.observe_decode(self.n_kv_first, len(steps), sum(steps))
        elif steps:  # the batch scale learns how much slower its step was in the batch
            alone_s = self.model.step_s(self.n_kv_first + len(steps) // 2, EXPECTED)
            if alone_s > 0:
                self.runner.batch_scale.observe(self.scale_size,
                                                sum(steps) / len(steps) / alone_s)
        result.decode_time_s = out.decode_s
        result.response_tokens = len(out.token_ids)
        self._decoded(out)

    # --- outcomes ----------------------------------------------------------------------
    def _decoded(self, out):
        job, result = self.job, self.result
        stopped_for_time = out.stop_reason in (stopping.DEADLINE, stopping.CANNOT_FINISH)
        if out.stop_reason == stopping.CANCELED or (
                stopped_for_time and not job.policy.keeps_text_at_deadline):
            self._stopped(out.stop_reason)
            return
        late_s = self.clock() - job.deadline_s
        result.stop_phase = 'decode'
        if late_s > 0 and job.policy.discards_late_result:
            result.status = status.KILLED
            result.kill_latency_s = late_s
            result.message = f'finished {late_s:.3f} s after the deadline; response discarded'
            return
        result.status = status.COMPLETED
        result.response = out.text
        result.deadline_met = late_s <= 0
        result.finish_reason = FINISH_OF_STOP.get(out.stop_reason, status.FINISH_LENGTH)
        when = 'on time' if late_s <= 0 else f'{late_s:.3f} s late ({job.policy.name})'
        if stopped_for_time:
            result.truncated = True
            why = ('at the deadline' if out.stop_reason == stopping.DEADLINE
                   else 'the next token could not arrive before the deadline')
            how = f'truncated after {len(out.token_ids)} tokens: {why}'
        else:
            how = STOP_WORDS.get(out.stop_reason, 'max_new_tokens reached')
        result.message = f'completed ({how}), {when}'
        if job.grammar is not None and out.stop_reason != stopping.EOS:
            # Only EOS follows a whole document: any other ending leaves a valid prefix.
            result.message += '; json_schema: the JSON document is incomplete'
        if job.infeasible:
            result.message += f'; {job.admission_note}'

    def _stopped(self, reason):
        """Fill the result of a goal stopped by ``reason`` during ``self.phase``."""
        job, result, phase = self.job, self.result, self.phase
        now = self.runner.timed_now()  # kill latency: once the stopped work has drained
        result.stop_phase = phase
        if reason == stopping.CANCELED:
            if job.cancel_reason == 'shutdown':
                result.status = status.FAILED
                result.message = f'server shut down during {phase}'
            else:
                result.status = status.CANCELED
                result.message = f'canceled during {phase}'
            return
        result.status = status.KILLED
        result.kill_latency_s = now - job.deadline_s
        no_text = ' (no text yet to return)' if job.policy.keeps_text_at_deadline else ''
        if reason == stopping.DEADLINE:
            result.message = f'killed at the deadline during {phase}{no_text}'
        else:
            result.message = (f'killed during {phase}, {job.deadline_s - now:.3f} s before the '
                              'deadline: the time model says it can no longer finish'
                              f'{no_text}')
