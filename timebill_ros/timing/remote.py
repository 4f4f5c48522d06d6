"""The time model of a model served remotely, and its max_tokens decision.

A request's time has two parts, both measured at this node (network and queueing included):

* the **first token** arrives ``r + u (N_x - N_cached)`` seconds after the request is sent:
  ``r`` the round trip and the engine's fixed cost, ``u`` its prefill per prompt token it
  does not hold yet (``N_cached``: the head it still holds from the last request,
  engine/remote/model.py);
* each further token ``v + w N_kv`` seconds later, ``N_kv`` the tokens before it.

A few probes through the API fit (r, u, v, w) at start-up (SimFLi's few-shot idea: any engine
behind the API is profiled the same way); then every goal's first-token time and steps
correct it online with the same speed factors and residual margins as the local model
(timing/online.py PhaseTracker): ``prefill`` tracks the first token, ``decode`` the steps.
The engine's queueing (other clients on a shared server) shows up as a first token later
than predicted; the peak-following factor adopts it at once, so admission and the max_tokens
decision see the load from the next goal on, and forget it gradually (``timing.speed_gain``).

There is no KV eviction on a remote engine. The budget decision is the request's
``max_tokens`` (:func:`decide_max_tokens`), N^_W-aware as alpha* is: when N^_W tokens fit the
time left the request asks for N_max (the answer is expected to end by itself in time);
otherwise for the most tokens that fit.

Only plausible observations are learned: a first token or steps more than
``1 / MIN_PLAUSIBLE_RATIO`` times faster than the probes' fit are what a stream that lies
(tokens the engine could not have made that fast) looks like, not the engine; one such sample
would lower every later estimate (three moved the factor from 1.0 to 0.0022, issue 58). They
are dropped and logged. Never imports rclpy.
"""

import dataclasses
import logging
import math

import numpy as np

from timebill_ros.checks import check_nonneg_real
from timebill_ros.config import OnlineSettings
from timebill_ros.timing.online import (DECIDE, DECODE, EXPECTED, LEAST, MIN_DECODE_STEPS,
                                        PREFILL, TrackedPhases)

# An observation measured / fitted below this is dropped (see the module docstring).
MIN_PLAUSIBLE_RATIO = 0.1


@dataclasses.dataclass(frozen=True)
class RemoteCoefficients:
    """The remote engine's times as fitted from probes, seconds.

    first_token_s: r, the first token's fixed time (round trip, request handling).
    prefill_token_s: u, each prompt token the engine does not hold yet.
    step_s: v, each further token's fixed time; step_kv_token_s: w, per token before it.
    """

    first_token_s: float
    prefill_token_s: float
    step_s: float
    step_kv_token_s: float

    def __post_init__(self):
        for field in dataclasses.fields(self):
            check_nonneg_real(field.name, getattr(self, field.name))


@dataclasses.dataclass(frozen=True)
class ProbePoint:
    """One probe request: N_x, N_cached, the first token's time and the steps after it.

    n_steps: tokens after the first; decode_s: their seconds (first to last arrival).
    """

    n_x: int
    n_cached: int
    first_token_s: float
    n_steps: int
    decode_s: float


def _line(x, y):
    """Return (intercept, slope) of the least-squares line, both clamped to >= 0.

    With one distinct x (or a negative slope) the slope is 0 and the intercept the mean.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(set(x.tolist())) < 2:
        return float(max(y.mean(), 0.0)), 0.0
    slope, intercept = np.polyfit(x, y, 1)
    if slope < 0:
        return float(max(y.mean(), 0.0)), 0.0
    if intercept < 0:  # through the origin instead
        return 0.0, float(max((x @ y) / (x @ x), 0.0))
    return float(intercept), float(slope)


def fit_probes(points) -> RemoteCoefficients:
    """Fit (r, u) to the first-token times and (v, w) to the mean steps of ``points``.

    r is the first-token time of the probe with the fewest uncached tokens (the repeated
    prompt: the engine's fixed cost and the round trip), u the least-squares slope of the
    others' first-token times above r against their uncached tokens (a free intercept
    would be set by the prefill's noise, and came out negative on llama.cpp). A probe's
    mean step is taken at the middle of its answer's KV, N_x + n_steps / 2. ValueError when
    there are no points or no probe decoded a step.
    """
    points = list(points)
    if not points:
        raise ValueError('no probe points to fit the remote time model')
    news = np.array([max(p.n_x - p.n_cached, 1) for p in points], dtype=float)
    firsts = np.array([p.first_token_s for p in points], dtype=float)
    least = int(np.argmin(news))
    rest = news - news[least]
    r = float(firsts[least])
    u = float(max((rest @ (firsts - r)) / (rest @ rest), 0.0)) if rest.any() else 0.0
    decoded = [p for p in points if p.n_steps > 0]
    if not decoded:
        raise ValueError('no probe decoded a second token: the engine answered every probe '
                         'with one token')
    v, w = _line([p.n_x + p.n_steps / 2.0 for p in decoded],
                 [p.decode_s / p.n_steps for p in decoded])
    return RemoteCoefficients(r, u, v, w)


class RemoteTimeModel(TrackedPhases):
    """The remote engine's times at the four bounds of timing/online.py; seconds.

    It answers what admission, the scheduler and the stats ask a TimeModel (prefill_s,
    step_s, decode_s, least_e2e_s, status); ``prefill`` is the time to the first token.
    Thread-safe. The state is not saved: the engine behind the URL may change between
    runs, so every start probes it again.
    """

    def __init__(self, coefficients: RemoteCoefficients, settings: OnlineSettings = None):
        if not isinstance(coefficients, RemoteCoefficients):
            raise TypeError(f'coefficients must be RemoteCoefficients, got {coefficients!r}')
        super().__init__(settings)
        self.coefficients = coefficients
        self.n_dropped = 0  # implausible observations not learned

    # --- estimates -------------------------------------------------------------------------
    def first_token_base_s(self, n_x: int, n_cached: int = 0) -> float:
        """Return the fitted first-token time of ``n_x`` prompt tokens, ``n_cached`` held."""
        co = self.coefficients
        return co.first_token_s + co.prefill_token_s * max(n_x - n_cached, 1)

    def prefill_s(self, n_x: int, bound: str = EXPECTED, n_chunks=None,
                  n_cached: int = 0) -> float:
        """Return the time to the first token at ``bound`` (n_chunks: unused, local only)."""
        return self._scale(PREFILL, bound) * self.first_token_base_s(n_x, n_cached)

    def step_s(self, n_kv: int, bound: str = EXPECTED) -> float:
        """Return one further token's time after ``n_kv`` tokens at ``bound``."""
        co = self.coefficients
        return self._scale(DECODE, bound) * (co.step_s + co.step_kv_token_s * n_kv)

    def _steps_base_s(self, n_kv_first: int, n_steps: int) -> float:
        co = self.coefficients
        return n_steps * (co.step_s + co.step_kv_token_s * n_kv_first) \
            + co.step_kv_token_s * n_steps * (n_steps - 1) / 2.0

    def decode_s(self, n_x: int, alpha: float, n_tokens: int, bound: str = EXPECTED) -> float:
        """Return ``n_tokens`` further tokens' time after the prompt (alpha: unused, 0)."""
        return self._scale(DECODE, bound) * self._steps_base_s(n_x, max(n_tokens, 0))

    def answer_s(self, n_x: int, n_cached: int, n_tokens: int, bound: str) -> float:
        """Return the time of an answer of ``n_tokens`` tokens: first token, then the rest."""
        if n_tokens <= 0:
            return 0.0
        return (self.prefill_s(n_x, bound, n_cached=n_cached)
                + self.decode_s(n_x, 0.0, n_tokens - 1, bound))

    def tokens_fitting(self, time_left_s: float, n_x: int, n_cached: int, n_max: int,
                       bound: str) -> int:
        """Return the most tokens (<= n_max) whose answer fits ``time_left_s`` at ``bound``."""
        low, high = 0, n_max
        while low < high:  # answer_s grows with n_tokens
            middle = (low + high + 1) // 2
            if self.answer_s(n_x, n_cached, middle, bound) <= time_left_s:
                low = middle
            else:
                high = middle - 1
        return low

    def least_e2e_s(self, n_x: int, n_cached: int = 0) -> float:
        """Return the least time of any answer: its first token at the LEAST bound."""
        return self.prefill_s(n_x, LEAST, n_cached=n_cached)

    # --- online updates ----------------------------------------------------------------
    def observe_prefill(self, n_x: int, measured_s: float, n_chunks=None,
                        n_cached: int = 0) -> None:
        """Add a goal's measured first-token time, seconds (dropped when implausible)."""
        self._plausible(PREFILL, self.first_token_base_s(n_x, n_cached), measured_s)

    def observe_decode(self, n_kv_first: int, n_steps: int, measured_s: float) -> None:
        """Add ``n_steps`` further tokens after ``n_kv_first`` tokens (MIN_DECODE_STEPS+)."""
        if n_steps < MIN_DECODE_STEPS:
            return
        self._plausible(DECODE, self._steps_base_s(n_kv_first, n_steps), measured_s)

    def _plausible(self, phase: str, base_s: float, measured_s: float) -> None:
        """Learn ``measured_s`` unless it is under MIN_PLAUSIBLE_RATIO x ``base_s``."""
        if base_s > 0 and measured_s < MIN_PLAUSIBLE_RATIO * base_s:
            self.n_dropped += 1
            logging.getLogger('timebill_ros.timing').warning(
                'remote %s: measured %.4f s where the fit says %.4f s; not learned (over %g '
                'times faster than the engine measured at start-up)', phase, measured_s,
                base_s, 1 / MIN_PLAUSIBLE_RATIO)
            return
        self._observe(phase, base_s, measured_s)

    def observe_predict(self, n_x: int, measured_s: float) -> None:
        """Nothing: the predictor's time is the goal's own, before its request."""

    def save(self, path: str) -> None:
        """Nothing: see the class doc (the service saves only with a state path)."""


@dataclasses.dataclass(frozen=True)
class MaxTokensDecision:
    """The request's max_tokens and why: ``capped`` when it is below N_max; n_w: N^_W."""

    max_tokens: int
    capped: bool
    n_w: int

    def describe(self, n_max: int) -> str:
        """Return the decision as the result message says it."""
        if not self.capped:
            return f'max_tokens {self.max_tokens} (N^_W {self.n_w} fits)'
        return (f'max_tokens {self.max_tokens} of N_max {n_max}: N^_W {self.n_w} does not fit '
                'the time left')


def decide_max_tokens(model: RemoteTimeModel, time_left_s: float, n_x: int, n_cached: int,
                      n_max: int, n_w: int, bound: str = DECIDE) -> MaxTokensDecision:
    """Return the request's max_tokens for the time left, seconds (the remote alpha*).

    N_max when N^_W tokens fit at ``bound``; else the most that fit (at least 1: admission
    already found that a first token fits at the LEAST bound).
    """
    if not math.isfinite(time_left_s):
        raise ValueError(f'time_left_s must be finite, got {time_left_s!r}')
    n_fit = model.tokens_fitting(time_left_s, n_x, n_cached, n_max, bound)
    if n_fit >= min(n_w, n_max):
        return MaxTokensDecision(n_max, False, n_w)
    return MaxTokensDecision(max(1, n_fit), True, n_w)
