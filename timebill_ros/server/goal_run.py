"""One goal's run through the pipeline on one engine (JobRunner's unit of work).

prefill in chunks (timing/chunks.py) with the length predictor beside it -> N^ -> alpha* for
the time left (timing/goal_budget.py) -> evict -> decode under the goal's criteria
(goal_criteria.py and its overrun policy) -> its terminal result (outcome.py). The run reads
the clock; the budget only computes.
"""

from timebill_ros.engine import GenerationStopped
from timebill_ros.engine import stopping
from timebill_ros.server import outcome, status
from timebill_ros.server.checkpoints import GoalCheckpoints, RestLength
from timebill_ros.server.goal_criteria import answer_criteria, sampler_for
from timebill_ros.server.pipeline import GoalPipeline
from timebill_ros.server.prediction import await_prediction
from timebill_ros.timing.budget import upper_tokens
from timebill_ros.timing.checkpoint import CacheNow
from timebill_ros.timing.chunks import chunk_sizes, planned
from timebill_ros.timing.goal_budget import GoalBudget
from timebill_ros.timing.online import EXPECTED, LEAST


class GoalRun(GoalPipeline):
    """The state of one goal while it runs (phase, criteria, timings).

    step_scale: the decoding step of the batch it runs in over a goal's step alone (1.0
    alone); the budget math and the early stop use the step so scaled. wait_s: expected
    seconds between its eviction and its first batched step (the prefills of the goals
    after it in the batch); alpha* and t^_WCET count them. scale_size: the batch size
    step_scale is for (what the batch scale learns this goal's measured steps as).
    """

    def __init__(self, runner, job, result, step_scale=1.0, wait_s=0.0, scale_size=1):
        super().__init__(runner, job, result)
        self.engine = runner.engine
        # A schema's token mask adds its cost to every step (measured at start-up).
        self.budget = GoalBudget(
            self.model, job.n_x, job.deadline_s, job.policy.budget_rules(), step_scale,
            runner.mask_step_s if job.grammar is not None else 0.0, wait_s)
        self.scale_size = scale_size
        self.n_upper = None  # N^_q of the prediction, tokens (budget.upper_quantile)
        self.length_output = None  # the readout's raw output (its length distribution)
        self.rest = None  # server.checkpoints.RestLength of timebill-online, else None
        self.checkpoints = None
        self.interrupt = stopping.StopCriteria(
            [stopping.CancelStop(job.cancel_event)]
            + list(job.policy.stop_criteria(job.deadline_s, self.clock)))

    # --- the pipeline (pipeline.py: execute = prepare, then run) -------------------------
    def prepare(self):
        """Prefill, predict, budget and evict; return (state, alpha) or None when it ended."""
        job, model, result = self.job, self.model, self.result
        prefix = self._find_prefix()
        if prefix is None:
            return None
        chunks = chunk_sizes(self.model, self.runner.config.engine, self.engine.n_layers,
                             job.n_x, job.n_cached)
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
            overhang_s = 0.0 if early and prediction.done() else None
        self.budget.set_head(len(chunks), job.n_cached, overhang_s)
        self._feedback(status.PHASE_PREFILL)
        if not early and readout is None:
            prediction = self.runner.submit_prediction(job.request.prompt, job.input_ids,
                                                       job.n_max)
        try:
            state = self.engine.prefill(job.input_ids, self._prefill_stop(),
                                        chunk_plan=planned(chunks, job.n_cached),
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
        alpha = self._decide(n_hat)
        self.phase = 'eviction'
        if not self._evict(state, alpha):
            return None
        self.phase = 'decode'
        return state, alpha

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

    def _prefill_stop(self):
        """Interrupts, plus (Kill / Partial) stop once the rest of the prefill cannot fit."""
        return stopping.StopCriteria(
            list(self.interrupt.criteria) + self.job.policy.prefill_criteria(
                self.job.deadline_s, self.budget.least_rest_s, self.clock))

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

        The wait (prediction.await_prediction) re-checks cancel, the deadline and (Kill /
        Partial) whether one decoding step still fits; it gives up after predictor.timeout_s.
        early: the prediction was started at admission (u_J); its time is not a
        beside-the-prefill t_Predict, so the time model does not learn from it.
        """
        job, result = self.job, self.result
        waited = await_prediction(
            future, prefill_end + self.runner.config.predictor.timeout_s,
            lambda: self.interrupt.check(0, None) or self._cannot_decode(0.0), self.clock)
        if waited.stop_reason is not None:
            self._drop(future)
            self._stopped(waited.stop_reason)
            return None
        done = waited.prediction
        if waited.late:
            future.cancel()
            result.predictor = 'fallback (predictor late)'
        elif waited.error is not None:
            exc = waited.error
            result.predictor = f'fallback (predictor error: {type(exc).__name__}: {exc})'
        elif 0 <= done.n_hat <= job.n_max:
            result.predictor = self.runner.predictor.name + (' (at admission)' if early else '')
            result.predict_time_s = done.end_s - done.start_s
            if not early:
                self.model.observe_predict(job.n_x, done.end_s - done.start_s)
            self._keep_upper(done.n_hat, done.n_upper)
            return done.n_hat
        else:
            result.predictor = (f'fallback (predictor error: predicted {done.n_hat} tokens, '
                                f'outside [0, {job.n_max}])')
        result.predict_time_s = self.clock() - prefill_end
        return job.n_max

    def _read_out(self, readout, state):
        """Return N^ read from the prefill's pooled states (the fallback N_max if it fails).

        Also sets N^_q (``budget.upper_quantile``). About a millisecond: no interrupt check.
        """
        job, result = self.job, self.result
        start = self.clock()
        try:
            output = readout.run(state.pooled)  # one call: N^ and, for the rest, its spread
            n_hat, n_upper = readout.format.bounds(output, job.n_max,
                                                   self.runner.config.budget.upper_quantile)
            if not 0 <= n_hat <= job.n_max:
                raise ValueError(f'predicted {n_hat} tokens, outside [0, {job.n_max}]')
            result.predictor = readout.name
            self.length_output = (readout.format, output)
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
        gives_up = self.job.policy.gives_up(
            lambda: self.budget.cannot_decode(self.clock(), extra_s))
        return stopping.CANNOT_FINISH if gives_up else None

    def _decide(self, n_hat):
        """Return alpha* for the time left; fill the budget fields of the result.

        timebill-online (``budget.checkpoint_tokens`` > 0): the rescue rule's alpha for the
        rest of N^_W (timing/checkpoint.py), decided again at each checkpoint.
        """
        cfg, job = self.runner.config.budget, self.job
        if cfg.mode != 'timebill' or not cfg.checkpoint_tokens:
            decision, wcet_s = self.budget.decide(self.clock(), n_hat, job.n_max, cfg,
                                                  self.n_upper)
            n_w, alpha = decision.n_w, decision.alpha
        else:
            n_w = upper_tokens(n_hat, cfg.pessimistic_factor, job.n_max, self.n_upper)
            self.rest = RestLength(n_hat, n_w, job.n_max, self._rest_bounds())
            plan = self.budget.decide_rest(self.clock(), CacheNow(job.n_x, job.n_x, 0, 0.0),
                                           max(0, n_w - 1), cfg, max(0, n_hat - 1))
            alpha, wcet_s = plan.alpha, self.budget.wcet_head_s + self.budget.wait_s \
                + plan.latest_s
        self.result.predicted_tokens = n_hat
        self.result.pessimistic_tokens = n_w
        self.result.eviction_ratio = alpha
        self.result.predicted_wcet_s = wcet_s
        return alpha

    def _rest_bounds(self):
        """Return n -> (N^_rem, N^_rem,q) from the readout's distribution, or None."""
        if self.length_output is None:
            return None
        output_format, output = self.length_output
        n_max, q = self.job.n_max, self.runner.config.budget.upper_quantile
        return lambda n_done: output_format.rest_bounds(output, n_max, n_done, q)

    def _read_rest_while_decoding(self, state):
        """Give the rest's bound the decode readout (the answer's own states), if loaded.

        Decoding then pools the answer's states (PrefillState.answer_pool) for it.
        """
        decode = getattr(self.runner.readout, 'decode', None)
        if decode is None or state.pooled is None:
            return
        decode.start(self.engine, state)
        self.result.predictor = f'{self.result.predictor} + {decode.name}'
        n_max, q = self.job.n_max, self.runner.config.budget.upper_quantile
        self.rest.decode_bounds = lambda n_done: decode.rest_bounds(
            state.pooled, state.answer_pool, n_done, n_max, q)

    def _evict(self, state, alpha):
        """Evict ``alpha`` of the prompt KV under the interrupts; return False if stopped."""
        if alpha <= 0:
            return True
        reason = self._cannot_decode(self.model.evict_s(self.job.n_x, LEAST))
        start = self.runner.timed_now()
        try:
            if reason is not None:
                raise GenerationStopped(reason)
            n_kv = self.engine.evict(state, alpha, interrupt=self.interrupt,
                                     keep_inputs=self.rest is not None)
        except GenerationStopped as stop:
            self._stopped(stop.reason)
            return False
        if n_kv < state.n_x:
            self.model.observe_evict(state.n_x, self.runner.timed_now() - start)
        return True

    def run(self, state, alpha):
        """Decode alone on the engine, then record the outcome."""
        stop, on_tokens = self._decode_criteria(state, alpha)
        out = self.engine.decode(state, self.job.n_max, stop, on_tokens,
                                 self.runner.config.engine.feedback_every_tokens,
                                 interrupt=self.interrupt, sampler=self._sampler(),
                                 checkpoint=self.checkpoints)
        self.decoded(out)

    def join(self, batch, state, alpha):
        """Join ``batch`` (engine DecodeBatch) under this goal's criteria; return the row id."""
        stop, on_tokens = self._decode_criteria(state, alpha)
        return batch.join(state, self.job.n_max, stop, on_tokens,
                          self.runner.config.engine.feedback_every_tokens,
                          interrupt=self.interrupt, sampler=self._sampler(),
                          checkpoint=self.checkpoints)

    def _sampler(self):
        """Return the goal's token picker (goal_criteria.sampler_for), None: greedy."""
        return sampler_for(self.job, self.engine, self.runner.config.engine)

    def _decode_criteria(self, state, alpha):
        """Return (stop criteria, feedback callback) of the decoding phase."""
        job = self.job
        self.n_kv_first = state.n_kv
        if self.rest is not None:
            self._read_rest_while_decoding(state)
            self.checkpoints = GoalCheckpoints(self, state, self.rest, alpha)
        self.timer = stopping.StepTimer(self.clock, sync=self.engine.synchronize)
        # The timer first: check() returns at the first criterion that fires, and the
        # boundary after the last step must still be recorded.
        by_content = answer_criteria(job, self.engine, self.runner.config.engine)
        if self.rest is not None:
            self.rest.loop_steps = _loop_steps(by_content)
        criteria = [self.timer, stopping.EosStop(self.engine.eos_token_ids),
                    stopping.MaxTokensStop(job.n_max)] + by_content \
            + list(self.interrupt.criteria)

        def next_step_s(n_generated):  # the cache as it is (a checkpoint may evict)
            return self.budget.next_step_s(state.n_kv)

        def rest_s(n_generated):
            return self.budget.rest_s(state.n_kv, n_generated, self.result.predicted_tokens,
                                      job.n_max)

        criteria += job.policy.decode_criteria(job.deadline_s, next_step_s, rest_s,
                                               self.clock)
        self._feedback(status.PHASE_DECODE, alpha=alpha)

        def on_tokens(n_generated, text):
            now_alpha = alpha if self.checkpoints is None else self.checkpoints.alpha
            self._feedback(status.PHASE_DECODE, n_generated, text, now_alpha)

        return stopping.StopCriteria(criteria), on_tokens

    def decoded(self, out):
        """Record the decoding phase's outcome ``out`` (engine DecodeResult)."""
        result = self.result
        # The model learns the step without the mask (its cost is the start-up figure).
        steps = [step / self.budget.mask_scale for step in self.timer.step_durations_s()]
        if self.checkpoints is not None:
            segments = self.checkpoints.segments(self.n_kv_first, steps)
            steps = [step for _, segment in segments for step in segment]
            # A loop's or stop string's cut leaves fewer tokens than were generated; the
            # rest's error counts what was generated (the timer checks once per token).
            cut = out.stop_reason in (stopping.REPETITION, stopping.STOP_STRING)
            self._record_checkpoints(len(self.timer.times_s) if cut else len(out.token_ids))
        else:
            segments = [(self.n_kv_first, steps)]
        if self.budget.step_scale == 1.0:  # the online model learns a goal's step alone
            for n_kv, segment in segments:
                self.model.observe_decode(n_kv, len(segment), sum(segment))
        elif steps:  # the batch scale learns how much slower its step was in the batch
            alone_s = self.model.step_s(self.n_kv_first + len(steps) // 2, EXPECTED)
            if alone_s > 0:
                self.runner.batch_scale.observe(self.scale_size,
                                                sum(steps) / len(steps) / alone_s)
        result.decode_time_s = out.decode_s
        result.response_tokens = len(out.token_ids)
        self._decoded(out)

    def _record_checkpoints(self, n_tokens):
        """Put the re-decisions on the result; the last one's N^_rem error (tokens)."""
        result, done = self.result, self.checkpoints.redecisions
        result.eviction_ratio = self.checkpoints.alpha
        result.checkpoint_tokens = tuple(r.n_generated for r in done)
        result.checkpoint_ratios = tuple(r.alpha for r in done)
        result.checkpoint_wcet_s = tuple(r.wcet_s for r in done)
        if done:
            result.rest_error_tokens = done[-1].rest_tokens - (n_tokens - done[-1].n_generated)

    # --- outcomes (server/outcome.py) -----------------------------------------------------
    def _decoded(self, out):
        if outcome.ends_stopped(self.job, out):
            self._stopped(out.stop_reason)
            return
        outcome.decoded(self.job, self.result, out, self.clock() - self.job.deadline_s)


def _loop_steps(criteria):
    """Return the loop guard's steps_to_fire among ``criteria``, or None without a guard."""
    guards = [c for c in criteria if isinstance(c, stopping.LoopGuard)]
    return guards[0].steps_to_fire if guards else None
