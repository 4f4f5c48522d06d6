"""The self-correcting time model: Eq. 4 times a tracked speed factor, with a learned margin.

Why speed factors and not recursive least squares on Eq. 4's coefficients: what drifts on a
shared machine is the *speed* (other processes, clock frequency, the length predictor running
beside the prefill on the same cores), which scales every cost of a phase by about the same
factor. One factor per phase is identified by a single goal, whatever its length; RLS with
forgetting on (a, b, c) or (p, q) needs goals spread over many prompt and cache lengths to
stay well-conditioned, which a robot's stream of similar goals does not give, and a drifting
quadratic term would bend long-prompt estimates the most. So the calibrated shape (Eq. 4a/4b)
stays and each phase tracks

* a **speed factor** s, a peak follower of measured / calibrated: a goal that ran slower
  than s sets s to its ratio at once; a faster one moves log s towards its ratio with weight
  ``timing.speed_gain``. The calibration (s = 1) is the starting point. A worst case must
  not be lowered by one fast moment - on the development VM decoding swings between 60 and
  95 ms a step within minutes, and a start-up warm-up that caught a fast moment made the
  next goal overrun its t^_WCET - while a slow-down must count at once; and
* its **residuals** e = measured / (s x calibrated), each taken *before* that sample moved
  s (so they are honest out-of-sample errors), over the last ``timing.residual_window``
  goals (not for the first sample, which measures the calibration's age, not the model).

Every estimate comes in four bounds: ``EXPECTED`` = s x calibrated; ``WORST`` = that x the
``timing.wcet_quantile`` upper quantile of the residuals (at least 1) - what t^_WCET uses;
``DECIDE`` = the same at ``timing.decision_quantile`` - what alpha* is solved at (the length
bound N^_W already carries the predictor's margin); ``LEAST`` = that x the lower quantile (at
most 1) - what admission and early Kill use, so a goal is never refused for a slowness the
machine might not show. Until a phase has
``timing.min_residuals`` residuals, ``timing.prior_margin`` (and its inverse) widen the bounds.

Phases: ``prefill`` (Eq. 4a, measured as the server runs it: with the length predictor
beside it), ``decode`` (Eq. 4b summed over a goal's steps), ``evict`` (SnapKV scoring and
gather, a per-prompt-token cost) and ``predict`` (the RLP's own t^_Predict fit).
The state is saved to YAML (``timing.state_file``) and restored at start-up when it belongs
to the same calibration. Thread-safe. Never imports rclpy.
"""

import collections
import dataclasses
import math
import os
import tempfile
import threading
from typing import Callable, Optional

import numpy as np
import yaml

from timebill_ros.checks import check_int, check_nonneg_real
from timebill_ros.config import OnlineSettings
from timebill_ros.timing.model import TimingCoefficients, now_iso

EXPECTED, WORST, LEAST, DECIDE = 'expected', 'worst', 'least', 'decide'
BOUNDS = (EXPECTED, WORST, LEAST, DECIDE)
PREFILL, DECODE, EVICT, PREDICT = 'prefill', 'decode', 'evict', 'predict'
PHASES = (PREFILL, DECODE, EVICT, PREDICT)
# Calibrated eviction cost before any is measured: SnapKV scoring + gather measured at about
# 40 ms for 803 prompt tokens on the development CPU (docs/benchmark.md); the speed factor
# corrects it.
EVICT_PRIOR_S_PER_TOKEN = 5e-5
# A decode sample needs this many steps: fewer are one step's jitter, while the margin it
# feeds is applied to sums of up to hundreds of steps.
MIN_DECODE_STEPS = 8
STATE_VERSION = 1


class PhaseTracker:
    """Speed factor and residual window of one phase (not locked: TimeModel locks)."""

    def __init__(self, settings: OnlineSettings):
        self.settings = settings
        self.log_factor = 0.0
        self.n_samples = 0
        self.residuals = collections.deque(maxlen=settings.residual_window)

    @property
    def factor(self) -> float:
        """Return the speed factor s (measured / calibrated; 1 = as calibrated)."""
        return math.exp(self.log_factor) if self.settings.enabled else 1.0

    def observe(self, base_s: float, measured_s: float) -> None:
        """Add one measurement of something the calibration predicts ``base_s`` seconds for."""
        if not (base_s > 0 and measured_s > 0 and math.isfinite(measured_s)):
            return
        ratio = measured_s / base_s
        if self.n_samples:  # the first sample measures the calibration, not the model
            self.residuals.append(ratio / self.factor)
        log_ratio = math.log(ratio)
        if log_ratio > self.log_factor:  # slower than assumed: adopted at once
            self.log_factor = log_ratio
        else:  # faster: believed only gradually
            self.log_factor += self.settings.speed_gain * (log_ratio - self.log_factor)
        self.n_samples += 1

    def margin(self, bound: str) -> float:
        """Return the residual multiplier of ``bound`` (1 for EXPECTED or when disabled)."""
        if bound == EXPECTED or not self.settings.enabled:
            return 1.0
        s = self.settings
        upper = bound in (WORST, DECIDE)
        values = np.asarray(self.residuals, dtype=float)
        if values.size:
            q = {WORST: s.wcet_quantile,
                 DECIDE: min(s.decision_quantile, s.wcet_quantile)}.get(
                     bound, 1.0 - s.wcet_quantile)
            # 'higher' / 'lower': never interpolate towards the middle of a small window.
            seen = float(np.quantile(values, q, method='higher' if upper else 'lower'))
        else:
            seen = 1.0
        if values.size < s.min_residuals:
            prior = s.prior_margin if upper else 1.0 / s.prior_margin
            seen = max(seen, prior) if upper else min(seen, prior)
        return max(1.0, seen) if upper else min(1.0, seen)

    def state(self) -> dict:
        """Return the persistable state."""
        return {'log_factor': self.log_factor, 'n_samples': self.n_samples,
                'residuals': [float(r) for r in self.residuals]}

    def restore(self, state: dict) -> None:
        """Restore :meth:`state` output (ValueError/TypeError when malformed)."""
        log_factor = float(state['log_factor'])
        if not math.isfinite(log_factor):
            raise ValueError(f'log_factor must be finite, got {log_factor!r}')
        residuals = [float(r) for r in state['residuals']]
        if any(not (r > 0 and math.isfinite(r)) for r in residuals):
            raise ValueError('residuals must be finite and > 0')
        self.log_factor = log_factor
        self.n_samples = check_int('n_samples', state['n_samples'])
        self.residuals.clear()
        self.residuals.extend(residuals)


@dataclasses.dataclass(frozen=True)
class PhaseStatus:
    """One phase for stats: speed factor, WORST / LEAST margins, samples seen."""

    speed_factor: float
    upper_margin: float
    lower_margin: float
    n_samples: int


class TrackedPhases:
    """One PhaseTracker per phase behind a lock: the online half of a time model.

    The local TimeModel and the remote one (timing/remote.py) scale their fitted times by
    :meth:`_scale` and learn through :meth:`_observe`.
    """

    def __init__(self, settings: OnlineSettings = None):
        self.settings = settings or OnlineSettings()
        self.phases = {name: PhaseTracker(self.settings) for name in PHASES}
        self._lock = threading.Lock()

    def _scale(self, phase: str, bound: str) -> float:
        """Return the multiplier of ``phase``'s fitted times at ``bound``: factor x margin."""
        if bound not in BOUNDS:
            raise ValueError(f'bound must be one of {BOUNDS}, got {bound!r}')
        with self._lock:
            tracker = self.phases[phase]
            return tracker.factor * tracker.margin(bound)

    def _observe(self, phase: str, base_s: float, measured_s: float) -> None:
        with self._lock:
            self.phases[phase].observe(base_s, measured_s)

    def status(self, phase: str) -> PhaseStatus:
        """Return the speed factor, margins and sample count of ``phase``."""
        with self._lock:
            tracker = self.phases[phase]
            return PhaseStatus(tracker.factor, tracker.margin(WORST), tracker.margin(LEAST),
                               tracker.n_samples)


class TimeModel(TrackedPhases):
    """Eq. 4 with online speed factors and residual margins; all times in seconds.

    coefficients: the calibration's Eq. 4 (TimingCoefficients).
    predict_s: N_x (tokens) -> calibrated t^_Predict of the length predictor, seconds, or
        None when the predictor costs nothing (the fallback).
    settings: OnlineSettings. calibration_created: the calibration's ``created`` stamp,
        which the saved state must match to be restored.
    """

    def __init__(self, coefficients: TimingCoefficients, settings: OnlineSettings = None,
                 predict_s: Optional[Callable[[int], float]] = None,
                 calibration_created: str = '', calibration_chunk_tokens: int = 512,
                 copy_token_s: float = 0.0):
        if not isinstance(coefficients, TimingCoefficients):
            raise TypeError(f'coefficients must be TimingCoefficients, got {coefficients!r}')
        self.coefficients = coefficients
        # Seconds per prompt token copied into or out of the prefix store (timing/prefix.py);
        # 0 without a store.
        self.copy_token_s = check_nonneg_real('copy_token_s', copy_token_s)
        self.calibration_chunk_tokens = check_int('calibration_chunk_tokens',
                                                  calibration_chunk_tokens, 1)
        super().__init__(settings)
        self.predict_base_s = predict_s
        self.calibration_created = calibration_created

    # --- estimates -----------------------------------------------------------------------
    def _prefill_base_s(self, n_x: int, n_chunks: Optional[int], n_cached: int = 0) -> float:
        """Eq. 4a, plus the per-call overhead c of each chunk beyond the calibration's.

        Eq. 4a was fitted on prefills in chunks of ``calibration_chunk_tokens``; a prefill in
        more (smaller) chunks pays c (one forward pass's overhead) once more per extra chunk
        (bench/studies/chunk_cost.py on the 2-core VM: 2,750 tokens in 128-token chunks took
        1.29-1.42x the time in 512-token chunks, 0.17-0.23 s per extra chunk; c was 0.11-0.16
        s). Without this, a goal prefilled in small chunks would read as a slower machine.
        n_cached: the prompt's first tokens copied from the prefix store: the prefill is then
        tokens n_cached..n_x attending over them (Eq. 4a's difference plus its c). With a
        store, every prompt token is copied once, out of it (the cached head) or into it
        (the rest): ``copy_token_s`` each.
        """
        n_new = check_int('n_x', n_x) - check_int('n_cached', n_cached)
        co = self.coefficients
        if n_cached:
            base = co.prefill_s(n_x) - co.prefill_s(n_cached) + co.c
        else:
            base = co.prefill_s(n_x)
        base += self.copy_token_s * n_x
        if n_chunks is None:
            return base
        calibrated = -(-n_new // self.calibration_chunk_tokens)
        return base + co.c * max(0, n_chunks - calibrated)

    def prefill_s(self, n_x: int, bound: str = EXPECTED, n_chunks: Optional[int] = None,
                  n_cached: int = 0) -> float:
        """Return the prefill time of an ``n_x``-token prompt (Eq. 4a, corrected).

        n_chunks: the forward passes it will take (None: as in the calibration).
        n_cached: its first tokens found in the prefix store (copied, not prefilled).
        """
        return self._scale(PREFILL, bound) * self._prefill_base_s(n_x, n_chunks, n_cached)

    def prefill_rest_s(self, n_done: int, n_x: int, bound: str = EXPECTED) -> float:
        """Return the time to prefill tokens ``n_done``..``n_x`` (Eq. 4a differences)."""
        co = self.coefficients
        if check_int('n_done', n_done) >= n_x:
            return 0.0
        # prefill_s(0) is c, so the difference drops the constant: every chunk pays it.
        rest = co.prefill_s(n_x) - co.prefill_s(n_done) + co.c
        return self._scale(PREFILL, bound) * max(0.0, rest)

    def chunk_s(self, begin: int, n_tokens: int, bound: str = EXPECTED) -> float:
        """Return the time of one prefill chunk of ``n_tokens`` tokens from ``begin``.

        Eq. 4a's difference a((begin + n)^2 - begin^2) + b n, plus its constant c for every
        chunk (each forward pass pays the per-call overhead).
        """
        co = self.coefficients
        end = begin + n_tokens
        base = co.a * (end * end - begin * begin) + co.b * n_tokens + co.c
        return self._scale(PREFILL, bound) * base

    def step_s(self, n_kv: int, bound: str = EXPECTED) -> float:
        """Return the time of one decoding step with ``n_kv`` cached tokens (Eq. 4b)."""
        return self._scale(DECODE, bound) * self.coefficients.decode_step_s(n_kv)

    def decode_s(self, n_x: int, alpha: float, n_tokens: int, bound: str = EXPECTED) -> float:
        """Return the decoding phase of an ``n_tokens`` answer at eviction ratio ``alpha``."""
        return self._scale(DECODE, bound) * self.coefficients.decode_phase_s(
            n_x, alpha, n_tokens)

    def decode_coefficients(self, bound: str = WORST) -> TimingCoefficients:
        """Return Eq. 4 with p, q scaled to ``bound`` (what Eq. 11 solves alpha* with)."""
        scale = self._scale(DECODE, bound)
        co = self.coefficients
        return TimingCoefficients(co.a, co.b, co.c, co.p * scale, co.q * scale)

    def evict_s(self, n_x: int, bound: str = EXPECTED) -> float:
        """Return the time to score and evict the KV of an ``n_x``-token prompt."""
        return self._scale(EVICT, bound) * EVICT_PRIOR_S_PER_TOKEN * check_int('n_x', n_x)

    def predict_s(self, n_x: int, bound: str = EXPECTED) -> float:
        """Return the length predictor's time for an ``n_x``-token prompt (0 if none)."""
        if self.predict_base_s is None:
            return 0.0
        return self._scale(PREDICT, bound) * self.predict_base_s(n_x)

    def overhang_s(self, n_x: int, bound: str = EXPECTED, n_cached: int = 0) -> float:
        """Return the predictor time not hidden behind the prefill (it starts with it).

        WORST (and DECIDE) pair the slowest predictor with the fastest prefill, LEAST the
        reverse.
        """
        other = {WORST: LEAST, DECIDE: LEAST, LEAST: WORST, EXPECTED: EXPECTED}[bound]
        return max(0.0, self.predict_s(n_x, bound)
                   - self.prefill_s(n_x, other, n_cached=n_cached))

    def least_e2e_s(self, n_x: int, n_cached: int = 0) -> float:
        """Return the least time a goal can take: prefill, overhang, one decoding step.

        n_cached: the prompt's first tokens found in the prefix store.
        """
        return (self.prefill_s(n_x, LEAST, n_cached=n_cached)
                + self.overhang_s(n_x, LEAST, n_cached) + self.step_s(n_x, LEAST))

    # --- online updates ----------------------------------------------------------------
    def observe_prefill(self, n_x: int, measured_s: float, n_chunks: Optional[int] = None,
                        n_cached: int = 0) -> None:
        """Add a goal's measured prefill of ``n_x`` tokens in ``n_chunks`` chunks, seconds.

        n_cached: its first tokens were copied from the prefix store.
        """
        self._observe(PREFILL, self._prefill_base_s(n_x, n_chunks, n_cached), measured_s)

    def observe_decode(self, n_kv_first: int, n_steps: int, measured_s: float) -> None:
        """Add ``n_steps`` decoding steps from ``n_kv_first`` cached tokens, ``measured_s`` s.

        Ignored below MIN_DECODE_STEPS steps.
        """
        if n_steps < MIN_DECODE_STEPS:
            return
        co = self.coefficients
        base = n_steps * (co.p * n_kv_first + co.q) + co.p * n_steps * (n_steps - 1) / 2.0
        self._observe(DECODE, base, measured_s)

    def observe_evict(self, n_x: int, measured_s: float) -> None:
        """Add one eviction of an ``n_x``-token prompt's KV, seconds."""
        self._observe(EVICT, EVICT_PRIOR_S_PER_TOKEN * n_x, measured_s)

    def observe_predict(self, n_x: int, measured_s: float) -> None:
        """Add one length prediction for an ``n_x``-token prompt, seconds."""
        if self.predict_base_s is not None:
            self._observe(PREDICT, self.predict_base_s(n_x), measured_s)

    # --- status and persistence --------------------------------------------------------
    def state(self) -> dict:
        """Return the persistable state as plain data."""
        with self._lock:
            return {'version': STATE_VERSION, 'calibration_created': self.calibration_created,
                    'updated': now_iso(),
                    'phases': {name: t.state() for name, t in self.phases.items()}}

    def restore(self, state: dict) -> None:
        """Restore the output of :meth:`state`.

        Raises ValueError when it is malformed or for another calibration (then nothing
        changes).
        """
        if not isinstance(state, dict) or state.get('version') != STATE_VERSION:
            raise ValueError(f'not a version-{STATE_VERSION} time-model state')
        if state.get('calibration_created') != self.calibration_created:
            raise ValueError(
                f"state belongs to the calibration of {state.get('calibration_created')!r}, "
                f'not {self.calibration_created!r}')
        fresh = {name: PhaseTracker(self.settings) for name in PHASES}
        try:
            for name, tracker in fresh.items():
                tracker.restore(state['phases'][name])
        except (KeyError, TypeError) as exc:
            raise ValueError(f'malformed time-model state: {exc!r}') from exc
        with self._lock:
            self.phases = fresh

    def save(self, path: str) -> None:
        """Write the state to ``path`` (YAML) atomically."""
        path = os.path.expanduser(path)
        folder = os.path.dirname(path) or '.'
        os.makedirs(folder, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=folder, prefix='.online-', suffix='.yaml')
        try:
            with os.fdopen(handle, 'w', encoding='utf-8') as stream:
                stream.write('# TimeBill online time-model state (speed factors, residuals).\n')
                yaml.safe_dump(self.state(), stream, sort_keys=False)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def load(self, path: str) -> bool:
        """Restore the state saved at ``path``; return False when there is none.

        Raises ValueError when the file is unreadable, malformed or for another calibration.
        """
        path = os.path.expanduser(path)
        if not os.path.isfile(path):
            return False
        try:
            with open(path, encoding='utf-8') as stream:
                state = yaml.safe_load(stream)
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f'{path}: {exc}') from exc
        self.restore(state)
        return True
