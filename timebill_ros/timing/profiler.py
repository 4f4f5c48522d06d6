"""Profiling-based fitting of the execution-time model (TimeBill Sec. 4.2).

:func:`profile` measures prefill and decoding-step times on a grid of prompt / KV-cache
lengths and fits Eq. 4 to them (:mod:`timebill_ros.timing.model`). :func:`load_or_calibrate`
is what the server calls at start-up: an explicit calibration file, else the per-user cache
entry, else a short, time-bounded start-up profiling run that is then cached.

The engine is used only through this protocol (duck typing): an LlmEngine through
timing/probes.py's EngineProbes, or any object offering it (a fake in tests, llama.cpp's
engine in bench/):

* ``engine.measure_prefill_s(n_x: int, repeats: int = 1) -> float``: median seconds of the
  prefill of an ``n_x``-token prompt;
* ``engine.measure_decode_step_s(n_kv: int, steps: int = 8) -> float``: median seconds of
  one decoding step with ``n_kv`` cached tokens;
* ``engine.context_tokens``: the model's context length, tokens.

This module never imports rclpy.
"""

import dataclasses
import math
import numbers
import random
import time
from typing import Callable, Optional, Tuple

import numpy as np

from timebill_ros.checks import check_int, check_lengths
from timebill_ros.config import EngineConfig
from timebill_ros.engine import model_source
from timebill_ros.timing.probes import probes_of
from timebill_ros.timing.model import (
    METHODS, Calibration, TimingCoefficients, fit_decode, fit_prefill, mape, now_iso)

MIN_GRID_TOKENS = 16
WALL_MARGIN = 0.25  # relative safety margin on fitted wall-time estimates
PREFILL = 'prefill'
DECODE = 'decode'
_UNKNOWNS = {PREFILL: 3, DECODE: 2}
_LENGTH_NAME = {PREFILL: 'N_x', DECODE: 'N_kv'}


@dataclasses.dataclass(frozen=True)
class ProfileGrid:
    """Lengths to measure and how.

    prefill_n_x: prompt lengths, tokens, strictly increasing, at least 3.
    decode_n_kv: KV-cache lengths, tokens, strictly increasing, at least 2.
    repeats: prefill repetitions per length (the engine reports the median).
    decode_steps: decoding steps per cache length (the engine reports the median).
    method: ``full_grid`` or ``startup``; recorded in the :class:`Calibration`.
    """

    prefill_n_x: Tuple[int, ...]
    decode_n_kv: Tuple[int, ...]
    repeats: int = 1
    decode_steps: int = 8
    method: str = 'full_grid'

    def __post_init__(self):
        """Check the fields, naming the bad one."""
        object.__setattr__(self, 'prefill_n_x', check_lengths(
            'prefill_n_x', self.prefill_n_x, _UNKNOWNS[PREFILL]))
        object.__setattr__(self, 'decode_n_kv', check_lengths(
            'decode_n_kv', self.decode_n_kv, _UNKNOWNS[DECODE]))
        check_int('repeats', self.repeats, 1)
        check_int('decode_steps', self.decode_steps, 1)
        if self.method not in METHODS:
            raise ValueError(f'method must be one of {METHODS}, got {self.method!r}')

    @classmethod
    def full_grid(cls, context_tokens, max_tokens=4096):
        """Return :func:`full_grid` ``(context_tokens, max_tokens)`` (tokens)."""
        return full_grid(context_tokens, max_tokens)

    @classmethod
    def startup_grid(cls, context_tokens=None):
        """Return :func:`startup_grid` ``(context_tokens)`` (tokens)."""
        return startup_grid(context_tokens)

    def check_fits(self, context_tokens):
        """Raise ValueError unless every length fits a context of ``context_tokens`` tokens."""
        if self.prefill_n_x[-1] > context_tokens:
            raise ValueError(f'prefill N_x={self.prefill_n_x[-1]} exceeds the engine context '
                             f'of {context_tokens} tokens')
        if self.decode_n_kv[-1] + self.decode_steps > context_tokens:
            raise ValueError(
                f'decode N_kv={self.decode_n_kv[-1]} plus {self.decode_steps} steps exceeds the '
                f'engine context of {context_tokens} tokens')


def _mixed_lengths(upper):
    """Return 6 evenly spaced lengths up to ``upper`` with powers of two from 16 below them."""
    linear = [round(upper * k / 6) for k in range(1, 7)]
    geometric = [MIN_GRID_TOKENS << k for k in range(32) if MIN_GRID_TOKENS << k < linear[0]]
    return tuple(sorted({n for n in geometric + linear if n >= MIN_GRID_TOKENS}))


def full_grid(context_tokens, max_tokens=4096):
    """Return the offline grid: about 12 lengths from 16 tokens to the limit, each phase.

    Lengths are powers of two (dense where times are small) plus six evenly spaced ones
    (dense where times are large), up to ``min(context_tokens, max_tokens)`` tokens for the
    prefill and that less the decoding steps for the KV cache. 3 prefill repeats, 8 steps.
    """
    context_tokens = check_int('context_tokens', context_tokens, 1)
    max_tokens = check_int('max_tokens', max_tokens, 1)
    steps = 8
    upper = min(context_tokens, max_tokens)
    if min(upper, context_tokens - steps) < 4 * MIN_GRID_TOKENS:
        raise ValueError(f'full_grid needs >= {4 * MIN_GRID_TOKENS + steps} context tokens '
                         f'and max_tokens >= {4 * MIN_GRID_TOKENS}, got context_tokens='
                         f'{context_tokens}, max_tokens={max_tokens}')
    return ProfileGrid(_mixed_lengths(upper), _mixed_lengths(min(upper, context_tokens - steps)),
                       repeats=3, decode_steps=steps, method='full_grid')


def startup_grid(context_tokens=None):
    """Return the small start-up grid: N_x 32..2048, N_kv 32..2048 tokens.

    Two prefill repeats and 16 decoding steps per length. With ``context_tokens`` (tokens),
    lengths that do not fit that context are left out.
    """
    prefill, decode, steps = (32, 128, 256, 512, 1024, 2048), (32, 256, 1024, 2048), 16
    if context_tokens is not None:
        context_tokens = check_int('context_tokens', context_tokens, 1)
        prefill = tuple(n for n in prefill if n <= context_tokens)
        decode = tuple(n for n in decode if n + steps <= context_tokens)
    return ProfileGrid(prefill, decode, repeats=2, decode_steps=steps, method='startup')


def key_fields(engine_config):
    """Return ``(model_key, device, dtype, threads)`` of an EngineConfig.

    The model key is :func:`timebill_ros.engine.model_source.model_key` (what ``engine.model_key``
    returns), so the CLI, the server and this module agree on calibration file names.
    ``dtype`` names the whole weight format, ``<dtype>-<forward>-<decode_weights>`` (e.g.
    ``float32-auto-float16``): the forward pass and the decode weights change the speed as
    much as the dtype does, so each combination gets its own calibration. A resolved
    ``prefill_dtype`` (a GGUF model's) is a fourth field (``float32-auto-gguf-bfloat16``).
    """
    if not isinstance(engine_config, EngineConfig):
        raise TypeError(f'engine_config must be an EngineConfig, got {engine_config!r}')
    weight_format = (f'{engine_config.dtype}-{engine_config.forward}-'
                     f'{engine_config.decode_weights}')
    if engine_config.prefill_dtype != 'auto':
        weight_format += f'-{engine_config.prefill_dtype}'
    return (model_source.model_key(engine_config), engine_config.device, weight_format,
            engine_config.threads)


def _check_engine(engine):
    """Return ``engine.context_tokens``; raise TypeError if the engine lacks the protocol."""
    for name in ('measure_prefill_s', 'measure_decode_step_s'):
        if not callable(getattr(engine, name, None)):
            raise TypeError(f'engine must have a callable {name}(), got {engine!r}')
    return check_int('engine.context_tokens', getattr(engine, 'context_tokens', None), 1)


@dataclasses.dataclass
class _Run:
    """Mutable state of one profiling run."""

    engine: object
    grid: ProfileGrid
    clock: Callable[[], float]
    time_limit_s: Optional[float]
    progress: Callable[[str], None]
    start: float = 0.0
    walls: dict = dataclasses.field(default_factory=lambda: {PREFILL: [], DECODE: []})
    points: dict = dataclasses.field(default_factory=lambda: {PREFILL: {}, DECODE: {}})

    def elapsed_s(self):
        """Return seconds since the run started."""
        return self.clock() - self.start

    def measure(self, kind, n):
        """Measure one length; return the engine's median seconds; record the wall time."""
        before = self.clock()
        if kind == PREFILL:
            value = self.engine.measure_prefill_s(n, repeats=self.grid.repeats)
        else:
            value = self.engine.measure_decode_step_s(n, steps=self.grid.decode_steps)
        self.walls[kind].append((n, self.clock() - before))
        if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                or not math.isfinite(value) or value <= 0:
            raise RuntimeError(f'engine {kind} measurement at {_LENGTH_NAME[kind]}={n} '
                               f'returned {value!r}, expected seconds > 0')
        return float(value)

    def estimate_wall_s(self, kind, n):
        """Return the estimated wall seconds of measuring ``kind`` at ``n`` tokens.

        Times do not decrease with length, so any measured length m >= n bounds it by
        ``wall(m)`` (the warm-up at the longest length makes one always available). With 3 or
        more distinct lengths of this kind measured, a non-negative quadratic fitted to the
        wall times, plus WALL_MARGIN, is the other candidate; before that,
        ``wall(m) * n / m`` for measured m < n (exact for affine wall times). The smallest
        candidate is returned, 0 when nothing is measured yet.
        """
        walls = self.walls[kind]
        candidates = [wall for m, wall in walls if m >= n]
        if len({m for m, _ in walls}) >= 3:
            a, b, c = fit_prefill(*zip(*walls))
            candidates.append((1.0 + WALL_MARGIN) * (a * n * n + b * n + c))
        else:
            candidates += [wall * n / m for m, wall in walls if m < n]
        return min(candidates, default=0.0)

    def fits_in_time(self, kind, n):
        """Return whether measuring ``kind`` at ``n`` tokens is expected to end in time."""
        if self.time_limit_s is None:
            return True
        return self.elapsed_s() + self.estimate_wall_s(kind, n) <= self.time_limit_s


def _warm_up(run):
    """Measure the longest length of each phase once, unrecorded.

    This brings caches and the allocator to their largest working set before anything is
    recorded, and its wall time bounds every later measurement of that phase for the time
    limit.
    """
    longest = {PREFILL: run.grid.prefill_n_x[-1], DECODE: run.grid.decode_n_kv[-1]}
    run.progress(f'warm-up: prefill N_x={longest[PREFILL]}, decode N_kv={longest[DECODE]}')
    for kind, n in longest.items():
        run.measure(kind, n)


def _measure_grid(run, tasks):
    """Measure ``tasks`` ((kind, grid index, tokens)) in order, deferring those out of time.

    A task whose estimated wall time does not fit the time left is deferred and retried after
    the others (later measurements tighten the estimate); the run stops when a whole pass
    measures nothing.
    """
    total, done = len(tasks), 0
    while tasks:
        deferred = []
        for kind, index, n in tasks:
            if not run.fits_in_time(kind, n):
                deferred.append((kind, index, n))
                continue
            t_s = run.measure(kind, n)
            run.points[kind][index] = (n, t_s)
            done += 1
            unit = 's' if kind == PREFILL else 's/step'
            run.progress(f'[{done}/{total}] {kind} {_LENGTH_NAME[kind]}={n}: {t_s:.6f} {unit}')
        if len(deferred) == len(tasks):
            break
        tasks = deferred
    for kind, _, n in tasks:
        run.progress(f'skipped {kind} {_LENGTH_NAME[kind]}={n}: would exceed '
                     f'time_limit_s={run.time_limit_s:g}')


def _predict(kind, coefficients, n):
    """Return Eq. 4a (prefill, coefficients (a, b, c)) or 4b (decode, (p, q)) at ``n``."""
    n = np.asarray(n, dtype=float)
    if kind == PREFILL:
        a, b, c = coefficients
        return a * n * n + b * n + c
    p, q = coefficients
    return p * n + q


def _fit(kind, points):
    """Fit one phase to ``[(tokens, seconds), ...]``; return its coefficients tuple."""
    n, t_s = np.asarray(points, dtype=float).reshape(-1, 2).T
    return fit_prefill(n, t_s) if kind == PREFILL else fit_decode(n, t_s)


def _distinct(points):
    """Return the number of distinct lengths among ``[(tokens, seconds), ...]``."""
    return len({n for n, _ in points})


def held_out_mape(kind, indexed, held_out_every):
    """Return the MAPE, percent, on held-out points of a fit on the others, or None.

    Grid indices 1, 1 + k, 1 + 2k, ... (k = held_out_every) are held out, so the shortest
    length stays in the training set and held-out points lie inside the range where possible.
    None when no held-out point was measured or the others are too few to fit.
    """
    held = [pt for i, pt in sorted(indexed.items()) if i % held_out_every == 1]
    train = [pt for i, pt in sorted(indexed.items()) if i % held_out_every != 1]
    if not held or _distinct(train) < _UNKNOWNS[kind]:
        return None
    coefficients = _fit(kind, train)
    held_n, held_t = np.asarray(held, dtype=float).T
    return mape(_predict(kind, coefficients, held_n), held_t)


def _fit_all(run):
    """Return TimingCoefficients fitted on every measured point; RuntimeError if too few."""
    prefill, decode = (sorted(run.points[k].values()) for k in (PREFILL, DECODE))
    if _distinct(prefill) < _UNKNOWNS[PREFILL] or _distinct(decode) < _UNKNOWNS[DECODE]:
        limit = '' if run.time_limit_s is None else f' within time_limit_s={run.time_limit_s:g}'
        raise RuntimeError(
            f'profiling got {len(prefill)} prefill point(s) (needs {_UNKNOWNS[PREFILL]}) and '
            f'{len(decode)} decode point(s) (needs {_UNKNOWNS[DECODE]}){limit}; allow more '
            'time or use a smaller grid')
    return TimingCoefficients(*_fit(PREFILL, prefill), *_fit(DECODE, decode))


def _check_profile_args(held_out_every, time_limit_s, clock, progress):
    """Check profile()'s keyword arguments, naming the bad one."""
    check_int('held_out_every', held_out_every, 2)
    if not callable(clock):
        raise TypeError(f'clock must be callable, got {clock!r}')
    if time_limit_s is not None:
        if isinstance(time_limit_s, bool) or not isinstance(time_limit_s, numbers.Real):
            raise TypeError(f'time_limit_s must be a number or None, got {time_limit_s!r}')
        if not math.isfinite(time_limit_s) or time_limit_s <= 0:
            raise ValueError(f'time_limit_s must be finite and > 0, got {time_limit_s!r}')
    if progress is not None and not callable(progress):
        raise TypeError(f'progress must be callable or None, got {progress!r}')


def engine_config_of(engine, engine_config):
    """Return ``engine_config``, else ``engine.engine_config`` if any, else EngineConfig()."""
    if engine_config is not None:
        return engine_config
    found = getattr(engine, 'engine_config', None)
    return found if isinstance(found, EngineConfig) else EngineConfig()


def profile(engine, grid, *, held_out_every=3, time_limit_s=None, clock=time.monotonic,
            rng_seed=0, progress=None, engine_config=None):
    """Measure ``grid`` on ``engine`` and fit Eq. 4; return a :class:`Calibration`.

    One unrecorded warm-up of each phase (longest length) comes first, then every grid length
    in a random order (seeded by ``rng_seed``) so drift does not correlate with length. The
    saved coefficients are fitted on ALL measured points; the reported MAPEs (percent) come
    from a separate fit that leaves out every ``held_out_every``-th length of each phase
    (grid indices 1, 1 + k, ...) and is scored on those.

    time_limit_s: soft bound, seconds, on the whole run (warm-up included) by ``clock``
        (monotonic seconds): a length whose estimated wall time does not fit what is left is
        skipped. If the points measured still determine the fit it is returned (MAPE None
        where nothing held out was measured), else RuntimeError says how many points it got.
    progress: called with one line of text per step (CLI output).
    engine_config: EngineConfig whose model/device/dtype/threads key the calibration (see
        :func:`key_fields`); None = ``engine.engine_config`` if the engine has one, else
        ``EngineConfig()``.
    """
    if not isinstance(grid, ProfileGrid):
        raise TypeError(f'grid must be a ProfileGrid, got {grid!r}')
    engine = probes_of(engine)
    grid.check_fits(_check_engine(engine))
    _check_profile_args(held_out_every, time_limit_s, clock, progress)
    model_key, device, dtype, threads = key_fields(engine_config_of(engine, engine_config))
    run = _Run(engine, grid, clock, time_limit_s, progress or (lambda _msg: None))
    run.start = clock()
    _warm_up(run)
    tasks = [(PREFILL, i, n) for i, n in enumerate(grid.prefill_n_x)]
    tasks += [(DECODE, i, n) for i, n in enumerate(grid.decode_n_kv)]
    random.Random(rng_seed).shuffle(tasks)
    _measure_grid(run, tasks)
    coefficients = _fit_all(run)
    prefill_mape, decode_mape = (held_out_mape(k, run.points[k], held_out_every)
                                 for k in (PREFILL, DECODE))
    prefill, decode = (tuple(sorted(run.points[k].values())) for k in (PREFILL, DECODE))
    return Calibration(
        coefficients=coefficients, model_key=model_key, device=device, dtype=dtype,
        threads=threads, prefill_mape_pct=prefill_mape, decode_mape_pct=decode_mape,
        n_points=len(prefill) + len(decode), profiling_s=max(run.elapsed_s(), 0.0),
        created=now_iso(), method=grid.method, prefill_points=prefill, decode_points=decode)


def _format_mape(value):
    """Return a MAPE for the report: ``1.23 %`` or ``n/a``."""
    return 'n/a (nothing held out)' if value is None else f'{value:.2f} %'


def format_report(calibration):
    """Return a human-readable multi-line report of a :class:`Calibration`."""
    if not isinstance(calibration, Calibration):
        raise TypeError(f'calibration must be a Calibration, got {calibration!r}')
    cal, co = calibration, calibration.coefficients
    rows = [
        ('key', cal.key),
        ('method', f'{cal.method}, created {cal.created}'),
        ('prefill', 't(N_x) = a N_x^2 + b N_x + c'),
        ('  a', f'{co.a:.6e} s/token^2'),
        ('  b', f'{co.b:.6e} s/token'),
        ('  c', f'{co.c:.6e} s'),
        ('decode step', 't(N_kv) = p N_kv + q'),
        ('  p', f'{co.p:.6e} s/token'),
        ('  q', f'{co.q:.6e} s'),
        ('MAPE prefill', _format_mape(cal.prefill_mape_pct)),
        ('MAPE decode', _format_mape(cal.decode_mape_pct)),
        ('points', f'{cal.n_points} ({len(cal.prefill_points)} prefill, '
                   f'{len(cal.decode_points)} decode)'),
        ('profiling', f'{cal.profiling_s:.1f} s'),
    ]
    batch = cal.batch_step
    if batch is not None:
        rows += [('batch step', 't(B, S) = q + r (B - 1) + p S, S = cached tokens of all B'),
                 ('  q', f'{batch.q:.6e} s'), ('  r', f'{batch.r:.6e} s/goal'),
                 ('  p', f'{batch.p:.6e} s/token'),
                 ('  points', f'{len(cal.batch_points)} (B = '
                  f'{", ".join(str(b) for b in sorted({b for b, _, _ in cal.batch_points}))})')]
    width = max(len(name) for name, _ in rows)
    lines = ['TimeBill timing calibration']
    lines += [f'  {name:<{width}}  {value}' for name, value in rows]
    return '\n'.join(lines)
