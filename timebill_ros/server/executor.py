"""Executors: a worker thread that runs queued goals through the TimeBill pipeline.

One goal at a time per executor:
prefill (length predictor in parallel on a CPU thread) -> alpha* (Eq. 11) -> evict -> decode,
under the goal's stop criteria (cancel, Kill deadline, EOS, N_max).
"""

import concurrent.futures
import threading
import time

from timebill_ros import stopping

from timebill_ros.server import status

from timebill_ros.timing import budget
from timebill_ros.engine import GenerationStopped
from timebill_ros.server.goals import Feedback, JobResult


def _timed_predict(predictor, prompt, input_ids, n_max, clock):
    start = clock()
    n_hat = predictor.predict(prompt, input_ids, n_max)
    return int(n_hat), start, clock()


class JobRunner:
    """Runs one job on an engine and returns its JobResult (never raises for job faults)."""

    def __init__(self, engine, predictor, coefficients, server_config, clock=time.monotonic):
        self.engine = engine
        self.predictor = predictor
        self.coefficients = coefficients
        self.config = server_config
        self.clock = clock
        self._predict_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix='timebill-predict')

    def close(self):
        """Stop the predictor thread."""
        self._predict_pool.shutdown(wait=True, cancel_futures=True)

    def run(self, job) -> JobResult:
        """Run ``job`` to a terminal JobResult."""
        job.started_s = self.clock()
        result = JobResult(status=status.FAILED, message='', prompt_tokens=len(job.input_ids))
        try:
            self._run(job, result)
        except Exception as exc:  # a model or predictor fault ends this goal only
            result.status = status.FAILED
            result.message = f'engine error: {type(exc).__name__}: {exc}'
            result.response = ''
        result.total_time_s = self.clock() - job.received_s
        return result

    def _feedback(self, job, phase, tokens=0, text='', alpha=0.0):
        job.on_feedback(Feedback(phase=phase, tokens_generated=tokens, text=text,
                                 elapsed_s=self.clock() - job.received_s, eviction_ratio=alpha))

    def _criteria(self, job):
        return [stopping.CancelStop(job.cancel_event)] + list(
            job.policy.stop_criteria(job.deadline_s, self.clock))

    def _run(self, job, result):
        self._feedback(job, status.PHASE_PREFILL)
        prediction = self._predict_pool.submit(
            _timed_predict, self.predictor, job.request.prompt, job.input_ids, job.n_max,
            self.clock)
        try:
            state = self.engine.prefill(job.input_ids, stopping.StopCriteria(self._criteria(job)))
        except GenerationStopped as stop:
            prediction.cancel()
            self._stopped(job, result, stop.reason, 'prefill')
            return
        prefill_end = self.clock()
        result.prefill_time_s = state.prefill_s
        n_hat, overhang_s = self._collect_prediction(job, result, prediction, prefill_end)
        decision = self._decide(job, n_hat, overhang_s)
        result.predicted_tokens = decision.n_hat
        result.pessimistic_tokens = decision.n_w
        result.eviction_ratio = decision.alpha
        result.predicted_wcet_s = decision.wcet_s
        self.engine.evict(state, decision.alpha)
        self._decode(job, result, state, decision)

    def _collect_prediction(self, job, result, prediction, prefill_end):
        """Return (N^, predictor seconds not hidden behind the prefill)."""
        try:
            n_hat, start, end = prediction.result(timeout=self.config.predictor.timeout_s)
            if not 0 <= n_hat <= job.n_max:
                raise ValueError(f'predicted {n_hat} tokens, outside [0, {job.n_max}]')
            result.predictor = self.predictor.name
            result.predict_time_s = end - start
            return n_hat, max(0.0, end - prefill_end)
        except concurrent.futures.TimeoutError:
            prediction.cancel()
            result.predictor = 'fallback (predictor late)'
        except Exception as exc:
            result.predictor = f'fallback (predictor error: {type(exc).__name__}: {exc})'
        result.predict_time_s = self.clock() - prefill_end
        return job.n_max, result.predict_time_s

    def _decide(self, job, n_hat, overhang_s):
        cfg = self.config.budget
        fixed = cfg.fixed_alpha if cfg.mode == 'fixed' else None
        time_left_s = job.deadline_s - job.started_s
        return budget.decide(self.coefficients, time_left_s, len(job.input_ids), n_hat,
                             job.n_max, cfg.pessimistic_factor, cfg.alpha_max,
                             t_predict_s=overhang_s, fixed_alpha=fixed)

    def _decode(self, job, result, state, decision):
        criteria = [stopping.EosStop(self.engine.eos_token_ids),
                    stopping.MaxTokensStop(job.n_max)] + self._criteria(job)
        self._feedback(job, status.PHASE_DECODE, alpha=decision.alpha)

        def on_tokens(n_generated, text):
            self._feedback(job, status.PHASE_DECODE, n_generated, text, decision.alpha)

        out = self.engine.decode(state, job.n_max, stopping.StopCriteria(criteria), on_tokens,
                                 self.config.engine.feedback_every_tokens)
        result.decode_time_s = out.decode_s
        result.response_tokens = len(out.token_ids)
        if out.stop_reason in (stopping.CANCELED, stopping.DEADLINE):
            self._stopped(job, result, out.stop_reason, 'decode')
            return
        late_s = self.clock() - job.deadline_s
        if late_s > 0 and job.policy.discards_late_result:
            result.status = status.KILLED
            result.kill_latency_s = late_s
            result.message = f'finished {late_s:.3f} s after the deadline; response discarded'
            return
        result.status = status.COMPLETED
        result.response = out.text
        result.deadline_met = late_s <= 0
        how = 'end of answer' if out.stop_reason == stopping.EOS else 'max_new_tokens reached'
        when = 'on time' if late_s <= 0 else f'{late_s:.3f} s late (skip-next)'
        result.message = f'completed ({how}), {when}'

    def _stopped(self, job, result, reason, phase):
        if reason == stopping.DEADLINE:
            result.status = status.KILLED
            result.kill_latency_s = self.clock() - job.deadline_s
            result.message = f'killed at the deadline during {phase}'
        elif job.cancel_reason == 'shutdown':
            result.status = status.FAILED
            result.message = f'server shut down during {phase}'
        else:
            result.status = status.CANCELED
            result.message = f'canceled during {phase}'


class Executor:
    """A worker thread that takes jobs from a queue and runs them with a JobRunner."""

    def __init__(self, name, queue, runner):
        self.name = name
        self.queue = queue
        self.runner = runner
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

    def _loop(self):
        while not self._stop.is_set():
            job = self.queue.pop(timeout_s=0.5)
            if job is None:
                continue
            self.current = job
            try:
                if job.cancel_event.is_set():
                    job.finish(JobResult(status=status.CANCELED,
                                         message='canceled before start'))
                    continue
                job.finish(self.runner.run(job))
            finally:
                self.current = None
