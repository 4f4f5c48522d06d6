"""The remote backends' pipeline: one goal on an engine behind an HTTP API, under its deadline.

N^ (only when the time left might not hold N_max tokens) -> max_tokens for the time left
(timing/remote.py decide_max_tokens: the remote alpha*) -> one streamed request
(engine/remote/client.py; the body, path and chunks in the API's WireFormat, e.g.
backends/openai.py) -> tokens as feedback. Kill ends the request at the deadline by
closing its connection, cancel at once; Partial returns the text streamed so far just before
the deadline; Skip-Next lets it finish late. The first token's time and the steps correct
the remote time model. A refused connection, a timeout, a 429 / 503, another HTTP error or a
stream cut mid-answer end the goal FAILED with its own error code (server/status.py).

What the server says is not trusted (issue 58): the answer's length is the tokens this side
counted (the server's ``usage`` only between that and max_tokens), an engine streaming more
than the max_tokens it was sent (plus ``MAX_TOKENS_SLACK``) is cut off (REMOTE_HTTP), and a
request still open at its ceiling (Skip-Next's only end besides the engine's) ends
REMOTE_TIMEOUT.
"""

import abc
import dataclasses
import queue
import random
import time

from timebill_ros.engine import stopping
from timebill_ros.engine.remote import client
from timebill_ros.engine.remote.model import RemoteModel
from timebill_ros.predictors import make_predictor
from timebill_ros.server import outcome, status
from timebill_ros.server.backends.base import Backend
from timebill_ros.server.goals import check_prompt, JobResult
from timebill_ros.server.pipeline import GoalPipeline
from timebill_ros.server.prediction import await_prediction, PredictorThread
from timebill_ros.server.service import TimeBillService
from timebill_ros.timing.budget import upper_tokens
from timebill_ros.timing.online import WORST
from timebill_ros.timing.remote import (decide_max_tokens, DECIDE, fit_probes,
                                        MaxTokensDecision, ProbePoint, RemoteTimeModel)

POLL_S = 0.005  # the goal's thread re-checks cancel and the deadline this often, seconds
# Partial stops this long before its deadline, so that its text is returned on time.
PARTIAL_MARGIN_S = 2 * POLL_S
# Tokens past the max_tokens sent before the request is cut off (an engine may stream one
# more chunk than it was asked for, e.g. a final empty-text chunk counted as a token).
MAX_TOKENS_SLACK = 2
# A request that stops nowhere else (Skip-Next) is ended at this multiple of its t^_WCET,
# or after engine.remote_idle_timeout_s when that is longer (a shared engine may hold it
# that long before its first token), seconds after the goal started.
CEILING_WCET_FACTOR = 4.0
ERROR_OF_KIND = {client.UNREACHABLE: status.ERROR_REMOTE_UNREACHABLE,
                 client.TIMEOUT: status.ERROR_REMOTE_TIMEOUT,
                 client.BUSY: status.ERROR_REMOTE_BUSY,
                 client.HTTP: status.ERROR_REMOTE_HTTP,
                 client.STREAM_CUT: status.ERROR_REMOTE_STREAM}
# The failures before any token that send a goal to the local fallback, and its name.
FALLBACK_ERRORS = (status.ERROR_REMOTE_UNREACHABLE, status.ERROR_REMOTE_BUSY,
                   status.ERROR_REMOTE_TIMEOUT)
FALLBACK = 'fallback'
PROBE_MAX_TOKENS = 32           # tokens each probe asks for
PROBE_LONG_TOKENS = 1024        # the long probes' prompt, tokens (at most a third of the context)
PROBE_WORDS = ('dock', 'shelf', 'pallet', 'door', 'charger', 'ramp', 'aisle', 'crate')


class WireFormat(abc.ABC):
    """A remote API's requests and stream chunks: what a new remote backend writes.

    The remote pipeline (:class:`RemoteRunner`) sends one streamed request a goal and reads
    TEXT events a token, then END (engine/remote/client.py is the transport); everything
    that differs between APIs is here. ``finish_of``: the API's finish reasons -> the
    engine's stop reasons (stopping.MAX_TOKENS, stopping.EOS).
    """

    finish_of = {'length': stopping.MAX_TOKENS, 'stop': stopping.EOS}

    @abc.abstractmethod
    def path(self, engine_config) -> str:
        """Return the endpoint a goal's request goes to, under ``engine.remote_url``."""

    @abc.abstractmethod
    def body(self, model, request, messages, max_tokens, engine_config) -> dict:
        """Return a goal's request: its prompt, the answer's cap, sampling and stops.

        model: the RemoteModel (name, chat template). request: the GoalRequest; messages:
        its earlier turns ((role, content) pairs); max_tokens: the cap the budget chose.
        """

    @abc.abstractmethod
    def probe_body(self, model, text, max_tokens, engine_config) -> dict:
        """Return a greedy request of the user turn ``text`` (a start-up probe)."""

    @abc.abstractmethod
    def parse_chunk(self, data: bytes):
        """Return (texts, finish_reason, usage) of one stream chunk (RemoteError if bad)."""

    @abc.abstractmethod
    def list_models(self, endpoint, timeout_s) -> list:
        """Return the model names the server serves (RemoteError when it cannot say)."""

    def answer_tokens(self, usage, n_counted, max_tokens) -> int:
        """Return the answer's length: the tokens counted here, or the server's usage.

        An engine may stream several tokens in one chunk (llama.cpp holds back text that
        might begin a stop string), so its ``completion_tokens`` is taken where it is
        plausible: an int from the tokens counted here up to the max_tokens sent.
        """
        claimed = usage.get('completion_tokens') if isinstance(usage, dict) else None
        if (isinstance(claimed, int) and not isinstance(claimed, bool)
                and n_counted <= claimed <= max_tokens):
            return claimed
        return n_counted


@dataclasses.dataclass
class Answer:
    """What a request streamed (the DecodeResult fields outcome.py reads)."""

    text: str
    token_ids: list
    stop_reason: str


class RemoteRunner:
    """Runs jobs on a remote engine and returns their JobResult (never raises for job faults).

    model: engine.remote.model.RemoteModel. predictor: LengthPredictor. time_model:
    timing.remote.RemoteTimeModel. endpoint: client.Endpoint. api: the API's WireFormat.
    clock: monotonic seconds.
    fallback: a local JobRunner (``engine.remote_fallback``) that runs a goal the remote
    engine could not start (unreachable, busy, silent before its first token) when its time
    model says the goal still fits; None: no fallback.
    """

    readout = None
    fallback = None

    def __init__(self, model, predictor, time_model, server_config, endpoint, api,
                 clock=time.monotonic):
        self.api = api
        self.engine = model
        self.predictor = predictor
        self.time_model = time_model
        self.config = server_config
        self.endpoint = endpoint
        self.clock = clock
        self._predictions = PredictorThread('timebill-predict', clock,
                                            server_config.budget.upper_quantile)

    def timed_now(self) -> float:
        """Return the clock (nothing is queued on this side)."""
        return self.clock()

    def close(self):
        """Stop the predictor thread (and the fallback's)."""
        if self.predictor is not None:
            self.predictor.abort()
        self._predictions.close()
        if self.fallback is not None:
            self.fallback.close()

    def submit_prediction(self, job):
        """Start the length predictor on the goal's prompt on its thread; return the future."""
        return self._predictions.submit(self.predictor, job.request.prompt, job.input_ids,
                                        job.n_max)

    def warm_up(self):
        """Nothing: the start-up probes (:meth:`probe`) measured the engine of the moment."""

    def open_stream(self, body):
        """Start one streamed request of ``body`` on the API's endpoint."""
        engine = self.config.engine
        return client.CompletionStream(self.endpoint, self.api.path(engine), body,
                                       engine.remote_connect_timeout_s,
                                       engine.remote_idle_timeout_s, self.clock,
                                       parse=self.api.parse_chunk)

    def request_body(self, request, messages, max_tokens):
        """Return the request body of a goal: its prompt, max_tokens, sampling and stops."""
        return self.api.body(self.engine, request, messages, max_tokens, self.config.engine)

    def run(self, job) -> JobResult:
        """Run ``job`` to a terminal JobResult (on the fallback when the engine failed it)."""
        goal = RemoteGoal(self, job)
        try:
            goal.execute()
        except Exception as exc:  # a fault in this goal ends this goal only
            goal.close()
            goal.failed(exc)
        result = goal.ended()
        if self.fallback is None or result.error_code not in FALLBACK_ERRORS \
                or goal.n_tokens or job.cancel_event.is_set():
            return result
        return self._run_locally(job, result)

    def _run_locally(self, job, remote):
        """Run ``job`` on the fallback if it still fits there; else return ``remote``."""
        fallback = self.fallback
        job.n_cached = fallback.engine.match_prefix(job.input_ids).n_tokens
        need_s = fallback.time_model.least_e2e_s(job.n_x, job.n_cached)
        left_s = job.deadline_s - self.clock()
        if job.policy.gives_up(lambda: need_s > left_s):
            remote.message += (f'; the local executor cannot fit it either (needs at least '
                               f'{need_s:.2f} s, {max(left_s, 0.0):.2f} s left)')
            return remote
        fallback.engine.bind_thread()
        local = fallback.run(job)
        local.executor = FALLBACK
        local.message = f'{local.message} (local fallback: {remote.message})'
        return local

    def run_batch(self, jobs, finish, more=None, capacity=None):
        """Run ``jobs`` one after another (the remote engine batches on its side)."""
        for job in jobs:
            finish(job, self.run(job))

    def probe(self, text, max_tokens, timeout_s=120.0) -> ProbePoint:
        """Send one greedy request of the user turn ``text``; return its times.

        RemoteError when the request fails.
        """
        model = self.engine
        input_ids = model.encode(text)
        n_cached = model.match_prefix(input_ids).n_tokens
        body = self.api.probe_body(model, text, max_tokens, self.config.engine)
        start = self.clock()
        stream = self.open_stream(body)
        self.engine.sent(input_ids)
        arrivals = []
        while True:
            try:
                event = stream.events.get(timeout=max(0.0, start + timeout_s - self.clock()))
            except queue.Empty:
                stream.close()
                raise client.RemoteError(client.TIMEOUT, f'probe took over {timeout_s} s')
            if event.kind == client.TEXT:
                arrivals.append(event.at_s)
            elif event.kind == client.ERROR:
                self.engine.forget()
                raise event.error
            else:
                break
        if not arrivals:
            raise client.RemoteError(client.HTTP, 'the probe got no token')
        return ProbePoint(len(input_ids), n_cached, arrivals[0] - start, len(arrivals) - 1,
                          arrivals[-1] - arrivals[0])


class RemoteGoal(GoalPipeline):
    """The state of one goal while its request runs (pipeline.py: prepare, then run)."""

    def __init__(self, runner, job):
        job.started_s = runner.timed_now()
        super().__init__(runner, job, JobResult(
            status=status.FAILED, message='', prompt_tokens=job.n_x,
            queue_time_s=job.started_s - job.received_s, batch_size=1))
        self.phase = 'queue'
        self.stream = None
        self.parts, self.first_s, self.last_s = [], None, None
        self.n_tokens, self.n_sent_feedback = 0, 0
        self.n_cached = 0
        self.max_tokens = job.n_max  # what the request asks the engine for
        self.stops_at_deadline = bool(job.policy.stop_criteria(job.deadline_s, self.clock))

    def close(self):
        """End the request if one is open."""
        if self.stream is not None:
            self.stream.close()

    # --- the pipeline ------------------------------------------------------------------
    def prepare(self):
        """Match the engine's held head, decide max_tokens; (decision,) or None if ended."""
        job, result = self.job, self.result
        if job.cancel_event.is_set():
            self._stopped(stopping.CANCELED)
            return None
        self.n_cached = self.runner.engine.match_prefix(job.input_ids).n_tokens
        result.cached_tokens = self.n_cached
        decision = self._decide()
        return None if decision is None else (decision,)

    def run(self, decision):
        """Send the request and stream the answer to its end."""
        job = self.job
        messages = check_prompt(job.request, self.runner.config.queue.max_prompt_chars)
        self.max_tokens = decision.max_tokens
        body = self.runner.request_body(job.request, messages, decision.max_tokens)
        self.phase = 'prefill'
        self.start_s = self.clock()
        self.stream = self.runner.open_stream(body)
        self.runner.engine.sent(job.input_ids)
        self._feedback(status.PHASE_PREFILL)
        self._stream_answer(decision)

    def _decide(self):
        """Return the MaxTokensDecision for the time left, or None when the goal stopped.

        N^ is predicted only where it can change the decision: under Kill (a late answer is
        lost, so a capped one is worth more) when N_max tokens do not fit the time left.
        """
        job, result, config = self.job, self.result, self.runner.config
        self.phase = 'predictor'
        n_hat, n_upper = job.n_max, None
        caps = job.policy.caps_tokens_to_fit()
        if caps and self.model.tokens_fitting(job.deadline_s - self.clock(), job.n_x,
                                              self.n_cached, job.n_max, DECIDE) < job.n_max:
            prediction = self._predict()
            if prediction is None:
                return None
            n_hat, n_upper = prediction
            n_w = upper_tokens(n_hat, config.budget.pessimistic_factor, job.n_max, n_upper)
            decision = decide_max_tokens(self.model, job.deadline_s - self.clock(), job.n_x,
                                         self.n_cached, job.n_max, n_w)
        else:  # N_max fits; or Partial returns what came by the deadline, Skip-Next is late
            result.predictor = 'not needed (N_max fits)' if caps else 'not needed'
            n_w = upper_tokens(n_hat, config.budget.pessimistic_factor, job.n_max)
            decision = MaxTokensDecision(job.n_max, False, n_w)
        result.predicted_tokens, result.pessimistic_tokens = n_hat, n_w
        result.max_tokens_sent = decision.max_tokens
        # t^_WCET of the run: what it spent until now (prediction, decision) and an answer of
        # min(N^_W, max_tokens) tokens, with one step more for an end-of-answer token.
        result.predicted_wcet_s = (self.clock() - job.started_s) + self.model.answer_s(
            job.n_x, self.n_cached, min(n_w, decision.max_tokens) + 1, WORST)
        return decision

    def _predict(self):
        """Return (N^, N^_q) from the queue-time prediction or a new one; None if stopped."""
        job, result, runner = self.job, self.result, self.runner
        future = job.prediction or runner.submit_prediction(job)

        def should_stop():
            if job.cancel_event.is_set():
                return stopping.CANCELED
            if self.stops_at_deadline and self.clock() >= job.deadline_s:
                return stopping.DEADLINE
            return None

        waited = await_prediction(future, self.clock() + runner.config.predictor.timeout_s,
                                  should_stop, self.clock, POLL_S)
        done = waited.prediction
        if waited.stop_reason is not None or waited.late:
            future.cancel()
        if waited.stop_reason is not None:
            self._stopped(waited.stop_reason)
            return None
        if waited.late:
            result.predictor = 'fallback (predictor late)'
            return job.n_max, None
        if waited.error is not None:
            exc = waited.error
            result.predictor = f'fallback (predictor error: {type(exc).__name__}: {exc})'
            return job.n_max, None
        result.predict_time_s = done.end_s - done.start_s
        if not 0 <= done.n_hat <= job.n_max:
            result.predictor = f'fallback (predicted {done.n_hat} tokens)'
            return job.n_max, None
        result.predictor = runner.predictor.name
        n_upper = done.n_upper
        if n_upper is not None and not done.n_hat <= n_upper <= job.n_max:
            n_upper = None
        return done.n_hat, n_upper

    def _stop_at_s(self):
        """Return when the goal's thread must end the request, or None (Skip-Next)."""
        if not self.stops_at_deadline:
            return None
        margin = PARTIAL_MARGIN_S if self.job.policy.keeps_text() else 0.0
        return self.job.deadline_s - margin

    def _ceiling_s(self):
        """Return when a request that stops nowhere else is ended (see CEILING_WCET_FACTOR)."""
        wcet_s = self.result.predicted_wcet_s or 0.0
        return self.job.started_s + max(CEILING_WCET_FACTOR * wcet_s,
                                        self.runner.config.engine.remote_idle_timeout_s)

    def _stream_answer(self, decision):
        """Read the stream until it ends, the goal is canceled or its deadline comes."""
        job, stop_at, ceiling = self.job, self._stop_at_s(), self._ceiling_s()
        while True:
            now = self.clock()
            if job.cancel_event.is_set():
                self._close()
                self._stopped(stopping.CANCELED)
                return
            if stop_at is not None and now >= stop_at:
                self._close()
                self._at_deadline()
                return
            if now >= ceiling:
                self._close()
                self._remote_error(client.RemoteError(
                    client.TIMEOUT, f'the answer ran past its ceiling, '
                                    f'{ceiling - job.started_s:.2f} s after the goal started'))
                return
            wait_s = max(0.0, min(POLL_S, (ceiling if stop_at is None else stop_at) - now))
            try:
                event = self.stream.events.get(timeout=wait_s)
            except queue.Empty:
                continue
            if event.kind == client.TEXT:
                if self.n_tokens >= self.max_tokens + MAX_TOKENS_SLACK:
                    self._close()
                    self._remote_error(client.RemoteError(
                        client.HTTP, f'the engine ignored max_tokens: sent '
                                     f'{self.max_tokens}, streamed more than '
                                     f'{self.n_tokens} tokens'))
                    return
                self._token(event)
            elif event.kind == client.ERROR:
                self._remote_error(event.error)
                return
            else:
                self._answered(event, decision)
                return

    def _close(self):
        """End the request mid-answer (the engine stops generating when its client leaves).

        The engine's held head is kept: llama-cpp-python 0.3.36 still held the prompt of a
        request closed mid-answer (its next request on the same prompt prefilled 1 token).
        """
        self.stream.close()

    def _token(self, event):
        if self.first_s is None:
            self.first_s = event.at_s
            self.phase = 'decode'
        self.last_s = event.at_s
        self.parts.append(event.text)
        self.n_tokens += 1
        every = self.runner.config.engine.feedback_every_tokens
        if self.n_tokens - self.n_sent_feedback >= every:
            text = ''.join(self.parts[self.n_sent_feedback:])
            self.n_sent_feedback = self.n_tokens
            self._feedback(status.PHASE_DECODE, self.n_tokens, text)

    def _observe(self, end=None):
        """Feed the measured first-token time and steps to the time model.

        end: the END event of an answer the engine finished: its steps then run to the
        END's arrival (the stream's end is part of the goal's time) and count the
        end-of-answer token the engine decoded but did not stream (finish_reason ``stop``).
        """
        job, result = self.job, self.result
        if self.first_s is None:
            return
        last_s, n_steps = self.last_s, self.n_tokens - 1
        if end is not None:
            last_s = end.at_s
            n_steps += 1 if self.runner.api.finish_of.get(end.finish_reason) == \
                stopping.EOS else 0
        result.prefill_time_s = self.first_s - self.start_s
        result.decode_time_s = last_s - self.first_s
        self.model.observe_prefill(job.n_x, result.prefill_time_s, n_cached=self.n_cached)
        self.model.observe_decode(job.n_x + 1, n_steps, result.decode_time_s)

    def _answered(self, event, decision):
        """Fill the result of an answer the engine ended (END event)."""
        job, result = self.job, self.result
        self._observe(event)
        n_tokens = self.runner.api.answer_tokens(event.usage, self.n_tokens, self.max_tokens)
        result.response_tokens = n_tokens
        answer = Answer(''.join(self.parts), [0] * n_tokens,
                        self.runner.api.finish_of.get(event.finish_reason, stopping.EOS))
        outcome.decoded(job, result, answer, event.at_s - job.deadline_s)
        if result.status == status.COMPLETED and decision.capped \
                and answer.stop_reason == stopping.MAX_TOKENS:
            result.message += f'; {decision.describe(job.n_max)}'

    def _at_deadline(self):
        """End the goal whose deadline (less Partial's margin) came with its request open."""
        self._observe()
        self.result.response_tokens = self.n_tokens
        if self.job.policy.keeps_text() and self.n_tokens:
            answer = Answer(''.join(self.parts), [0] * self.n_tokens, stopping.DEADLINE)
            outcome.decoded(self.job, self.result, answer,
                            self.clock() - self.job.deadline_s)
            return
        self._stopped(stopping.DEADLINE)

    def _remote_error(self, error):
        """End the goal FAILED with the error code of the remote failure's kind."""
        self.runner.engine.forget()  # a restarted or failing engine holds nothing of ours
        result = self.result
        result.status = status.FAILED
        result.error_code = ERROR_OF_KIND.get(error.kind, status.ERROR_REMOTE_HTTP)
        result.stop_phase = self.phase
        result.message = f'remote engine: {error}'
        result.response = ''


class RemoteBackend(Backend):
    """An existing engine serves the goals over HTTP; ``api``: its WireFormat.

    The model's tokenizer and the length predictor load here; the engine's times are probed
    through its API (a few greedy requests, ~1-5 s) and fitted (timing/remote.py). The remote
    engine batches and offloads on its own side, so the scheduler's consolidation, continuous
    batching and the offload executor are refused with the reason.
    """

    name = 'remote'  # not a backend itself: each API's subclass names one
    api = None

    @classmethod
    def check_config(cls, config):
        """Refuse batching and offload settings: the remote engine does both itself."""
        refused = [(config.scheduler.consolidation, 'scheduler.consolidation'),
                   (config.scheduler.continuous, 'scheduler.continuous'),
                   (config.offload.enabled, 'offload.enabled')]
        for is_set, name in refused:
            if is_set:
                raise ValueError(f'{name} is true, but engine.backend {cls.name} leaves '
                                 'batching and placement to the remote engine: set it false')

    @classmethod
    def build(cls, config, log=print):
        """Return the TimeBillService of a remote engine (not yet started).

        With ``engine.remote_fallback`` goals the engine could not start fall back to a
        local runner. RuntimeError when the engine cannot be reached or named: the node then
        fails to configure with that message, rather than start without a time model.
        """
        cls.check_config(config)
        from timebill_ros.server.backends.local import build_fallback
        fallback = build_fallback(config, log) if config.engine.remote_fallback else None
        engine = config.engine
        endpoint = client.Endpoint.parse(engine.remote_url)
        name = engine.remote_model or cls._first_model(endpoint, engine.remote_connect_timeout_s)
        log(f'remote engine: {engine.remote_url}, model {name!r} ({cls.name} backend, '
            f'{engine.remote_api} API)')
        model = RemoteModel.load(engine, name)
        log(f'remote engine: tokenizer of {model.model_key}, context {model.context_tokens} '
            'tokens')
        # The probes need neither the predictor nor the time model.
        runner = RemoteRunner(model, None, None, config, endpoint, cls.api)
        coefficients = fit_probes(probe_engine(runner, log))
        time_model = RemoteTimeModel(coefficients, config.timing.online_settings())
        # The RLP compresses long prompts against the engine's first-token time (Eq. 4a's).
        predictor = make_predictor(config.predictor, model.model_key, time_model.prefill_s,
                                   engine.model_cache_dir or None, log=log)
        runner.predictor, runner.time_model = predictor, time_model
        runner.fallback = fallback
        log(f'remote time model: first token {coefficients.first_token_s * 1e3:.1f} ms + '
            f'{coefficients.prefill_token_s * 1e6:.1f} us/uncached prompt token; each further '
            f'token {coefficients.step_s * 1e3:.2f} ms + '
            f'{coefficients.step_kv_token_s * 1e6:.2f} us/token before it')
        return TimeBillService(config, model, predictor, time_model, log=log, state_path=None,
                               runner=runner)

    @classmethod
    def _first_model(cls, endpoint, timeout_s):
        """Return the first model the server lists (RuntimeError if none or down)."""
        try:
            models = cls.api.list_models(endpoint, timeout_s)
        except client.RemoteError as exc:
            raise RuntimeError(f'engine.remote_url: cannot list the models: {exc}') from exc
        if not models:
            raise RuntimeError('engine.remote_url: the server lists no models; set '
                               'engine.remote_model')
        return models[0]


def probe_texts(tokenizer, n_long, seed=0):
    """Return the probe prompts: (short fresh, long fresh, the long again, long fresh).

    Each fresh one starts with words no other probe starts with, so the engine holds none
    of it; the repeat finds all of it held.
    """
    rng = random.Random(seed)

    def fresh(n_tokens):
        words, text = [], ''
        while len(tokenizer(text, add_special_tokens=False)['input_ids']) < n_tokens:
            words.append(f'{rng.choice(PROBE_WORDS)} {rng.randrange(1000)}')
            text = ', '.join(words)
        return f'Inventory: {text}. Describe the inventory.'

    long_text = fresh(n_long)
    return [fresh(16), long_text, long_text, fresh(n_long // 2)]


def probe_engine(runner, log=print):
    """Send the probes (:func:`probe_texts`) and return their ProbePoints.

    RuntimeError naming the failure when a probe fails.
    """
    model = runner.engine
    n_long = min(PROBE_LONG_TOKENS, model.context_tokens // 3)
    points = []
    for index, text in enumerate(probe_texts(model.tokenizer, n_long)):
        try:
            point = runner.probe(text, PROBE_MAX_TOKENS)
        except client.RemoteError as exc:
            raise RuntimeError(f'remote engine probe {index + 1} failed: {exc}') from exc
        log(f'remote probe {index + 1}: N_x {point.n_x} ({point.n_cached} held), first token '
            f'{point.first_token_s * 1e3:.0f} ms, {point.n_steps} more in '
            f'{point.decode_s * 1e3:.0f} ms')
        points.append(point)
    return points
