"""Workload-guided execution-time estimator (TimeBill Sec. 4.2, Eqs. 4-9).

The prefill phase of a prompt of N_x tokens takes ``a N_x^2 + b N_x + c`` seconds (Eq. 4a) and
one decoding step with N_kv cached tokens takes ``p N_kv + q`` seconds (Eq. 4b). After a
fraction alpha of the prompt's KV cache is evicted, decoding step i (i = 1 .. N-1) sees
``(1 - alpha) N_x + i - 1`` cached tokens (Eq. 5), so the decoding phase (Eqs. 6-7) and the
end-to-end time (Eq. 8; Eq. 9 is the same with N = N^_W) have closed forms.

The coefficients are fitted by bounded least squares (:func:`fit_prefill`,
:func:`fit_decode`) to times measured by :mod:`timebill_ros.timing.profiler`, and stored together
with the raw measurements and a fit report in a :class:`Calibration` YAML file, one per
model / device / dtype / threads (:func:`calibration_key`). This module never imports rclpy.
"""

import dataclasses
import datetime
import hashlib
import numbers
import os
import re
import tempfile
from typing import Iterable, Mapping, Optional, Tuple

import numpy as np
import scipy.optimize
import yaml

from timebill_ros.checks import check_int, check_nonneg_real, check_text
from timebill_ros.paths import cache_root

FORMAT_VERSION = 1
METHODS = ('full_grid', 'startup', 'few_shot')
COEFFICIENT_NAMES = ('a', 'b', 'c', 'p', 'q')
_YAML_HEADER = (
    '# TimeBill timing calibration (written by timebill_ros; see timebill profile).\n'
    '# t_prefill(N_x) = a N_x^2 + b N_x + c, t_decode_step(N_kv) = p N_kv + q, seconds.\n'
    '# prefill_points / decode_points: raw [tokens, seconds] measurements.\n')


def _check_alpha(alpha):
    """Return the KV eviction ratio ``alpha`` as a float; raise unless it is in [0, 1)."""
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(f'alpha must be a number, got {alpha!r}')
    if not 0 <= alpha < 1:
        raise ValueError(f'alpha must be in [0, 1), got {alpha!r}')
    return float(alpha)


@dataclasses.dataclass(frozen=True)
class TimingCoefficients:
    """Coefficients of Eq. 4, all finite and >= 0.

    a: seconds per token^2 (prefill, quadratic term).
    b: seconds per token (prefill, linear term).
    c: seconds (prefill, constant term).
    p: seconds per cached token (decoding step, linear term).
    q: seconds (decoding step, constant term).
    """

    a: float
    b: float
    c: float
    p: float
    q: float

    def __post_init__(self):
        """Check every coefficient and store it as a float."""
        for name in COEFFICIENT_NAMES:
            value = check_nonneg_real(f'coefficients.{name}', getattr(self, name))
            object.__setattr__(self, name, value)

    def prefill_s(self, n_x):
        """Return the prefill time in seconds of a prompt of ``n_x`` tokens (Eq. 4a)."""
        n_x = check_int('n_x', n_x)
        return self.a * n_x * n_x + self.b * n_x + self.c

    def decode_step_s(self, n_kv):
        """Return the time in seconds of one decoding step with ``n_kv`` cached tokens (Eq. 4b)."""
        n_kv = check_int('n_kv', n_kv)
        return self.p * n_kv + self.q

    def decode_phase_s(self, n_x, alpha, n_tokens):
        """Return the decoding-phase time in seconds (Eqs. 5-7, closed form).

        n_x: prompt length, tokens. alpha: KV eviction ratio in [0, 1) applied after the
        prefill. n_tokens: response length N, tokens; the prefill produces the first one, so
        there are N - 1 decoding steps and the result is 0 when ``n_tokens <= 1``. Equals
        ``sum_{i=1}^{N-1} p ((1 - alpha) n_x + i - 1) + q``.
        """
        n_x = check_int('n_x', n_x)
        alpha = _check_alpha(alpha)
        steps = max(check_int('n_tokens', n_tokens) - 1, 0)
        kept = (1.0 - alpha) * n_x
        return steps * (self.p * kept + self.q) + self.p * steps * (steps - 1) / 2.0

    def e2e_s(self, n_x, alpha, n_tokens):
        """Return the end-to-end time in seconds: prefill plus decoding phase (Eq. 8 / 9).

        n_x: prompt length, tokens. alpha: KV eviction ratio in [0, 1). n_tokens: response
        length (N^ for Eq. 8, the pessimistic N^_W for the WCET of Eq. 9), tokens.
        """
        return self.prefill_s(n_x) + self.decode_phase_s(n_x, alpha, n_tokens)

    def as_dict(self):
        """Return ``{'a': ..., 'q': ...}`` with plain floats."""
        return {name: getattr(self, name) for name in COEFFICIENT_NAMES}


def _fit_points(name, n, t_s):
    """Return ``(n, t_s)`` as float arrays after checking them; ``name`` names the length."""
    n = np.asarray(n, dtype=float)
    t_s = np.asarray(t_s, dtype=float)
    if n.ndim != 1 or t_s.ndim != 1 or n.shape != t_s.shape:
        raise ValueError(
            f'{name} and t_s must be 1-D and of equal length, got shapes {n.shape} and '
            f'{t_s.shape}')
    if not (np.all(np.isfinite(n)) and np.all(np.isfinite(t_s))):
        raise ValueError(f'{name} and t_s must be finite, got {n.tolist()} and {t_s.tolist()}')
    if np.any(n < 0) or np.any(t_s < 0):
        raise ValueError(f'{name} and t_s must be >= 0, got {n.tolist()} and {t_s.tolist()}')
    return n, t_s


def _nonneg_lstsq(columns, t_s):
    """Return x >= 0 minimising ``||columns @ x - t_s||``, as a tuple of floats.

    The columns are scaled to unit maximum before solving (N_x^2 and 1 differ by ~1e7), and
    the solution is scaled back.
    """
    scale = np.max(np.abs(columns), axis=0)
    scale[scale == 0] = 1.0
    # Non-negative bounds on every coefficient: predicted times can then never decrease as
    # the prompt or the KV cache grows, and are never negative.
    result = scipy.optimize.lsq_linear(columns / scale, t_s, bounds=(0.0, np.inf), method='bvls')
    return tuple(float(x) for x in result.x / scale)


def fit_prefill(n_x, t_s):
    """Fit Eq. 4a to measured prefill times; return ``(a, b, c)``.

    n_x: prompt lengths, tokens. t_s: measured prefill times, seconds. Needs at least 3
    distinct prompt lengths (3 unknowns); raises ValueError otherwise or on non-finite or
    negative values. Least squares with a, b, c >= 0 (scipy.optimize.lsq_linear).
    """
    n_x, t_s = _fit_points('n_x', n_x, t_s)
    distinct = len(np.unique(n_x))
    if distinct < 3:
        raise ValueError(f'fit_prefill needs >= 3 distinct n_x (3 unknowns), got {distinct}')
    return _nonneg_lstsq(np.column_stack([n_x * n_x, n_x, np.ones_like(n_x)]), t_s)


def fit_decode(n_kv, t_s):
    """Fit Eq. 4b to measured decoding-step times; return ``(p, q)``.

    n_kv: cached tokens, tokens. t_s: measured times of one decoding step, seconds. Needs at
    least 2 distinct cache lengths (2 unknowns); raises ValueError otherwise or on non-finite
    or negative values. Least squares with p, q >= 0 (scipy.optimize.lsq_linear).
    """
    n_kv, t_s = _fit_points('n_kv', n_kv, t_s)
    distinct = len(np.unique(n_kv))
    if distinct < 2:
        raise ValueError(f'fit_decode needs >= 2 distinct n_kv (2 unknowns), got {distinct}')
    return _nonneg_lstsq(np.column_stack([n_kv, np.ones_like(n_kv)]), t_s)


def fit_coefficients(prefill_points, decode_points):
    """Fit all of Eq. 4 to raw ``[n_x, t_s]`` and ``[n_kv, t_s]`` pairs (tokens, seconds)."""
    prefill = np.asarray(prefill_points, dtype=float).reshape(-1, 2)
    decode = np.asarray(decode_points, dtype=float).reshape(-1, 2)
    a, b, c = fit_prefill(prefill[:, 0], prefill[:, 1])
    p, q = fit_decode(decode[:, 0], decode[:, 1])
    return TimingCoefficients(a, b, c, p, q)


def mape(pred, actual):
    """Return the mean absolute percentage error of ``pred`` against ``actual``, in percent.

    Both are equally long non-empty sequences of finite numbers; ``actual`` must not
    contain 0.
    """
    pred = np.asarray(pred, dtype=float).ravel()
    actual = np.asarray(actual, dtype=float).ravel()
    if pred.size == 0 or pred.shape != actual.shape:
        raise ValueError(
            f'pred and actual must be non-empty and equally long, got {pred.size} and '
            f'{actual.size} values')
    if not (np.all(np.isfinite(pred)) and np.all(np.isfinite(actual))):
        raise ValueError(f'pred and actual must be finite, got {pred.tolist()}, '
                         f'{actual.tolist()}')
    if np.any(actual == 0):
        raise ValueError(f'actual must not contain 0, got {actual.tolist()}')
    return float(np.mean(np.abs(pred - actual) / np.abs(actual)) * 100.0)


_UNSAFE = re.compile(r'[^A-Za-z0-9._-]+')


def calibration_key(model_key, device, dtype, threads):
    """Return a filename-safe key for one model / device / dtype / threads combination.

    Characters other than letters, digits, ``.``, ``_`` and ``-`` become ``_``; when that (or
    shortening a very long model key) changed anything, a short hash of the original fields
    is appended so distinct combinations never share a key.
    """
    raw = [check_text('model_key', model_key), check_text('device', device),
           check_text('dtype', dtype), f't{check_int("threads", threads)}']
    safe = [_UNSAFE.sub('_', part).lstrip('.') or '_' for part in raw]
    safe[0] = safe[0][:80]
    key = '__'.join(safe)
    if safe != raw:
        digest = hashlib.sha256('\0'.join(raw).encode('utf-8')).hexdigest()[:10]
        key = f'{key}__{digest}'
    return key


def default_calibration_path(key, cache_dir=None):
    """Return ``<cache>/calibration/<key>.yaml`` (cache as in :func:`cache_root`)."""
    key = check_text('key', key)
    if _UNSAFE.search(key) or key.startswith('.'):
        raise ValueError(f'key must be filename-safe (see calibration_key), got {key!r}')
    return os.path.join(cache_root(cache_dir), 'calibration', f'{key}.yaml')


def _check_mape(name, value):
    """Return a MAPE (percent) as a float, or None when it was not measured."""
    return None if value is None else check_nonneg_real(name, value)


def _check_points(name, points):
    """Return ``[[tokens, seconds], ...]`` as a tuple of ``(int, float)`` pairs."""
    if isinstance(points, (str, bytes)) or not isinstance(points, Iterable):
        raise TypeError(f'{name} must be a list of [tokens, seconds] pairs, got {points!r}')
    checked = []
    for i, pair in enumerate(points):
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Iterable) or len(pair) != 2:
            raise ValueError(f'{name}[{i}] must be a [tokens, seconds] pair, got {pair!r}')
        checked.append((check_int(f'{name}[{i}][0]', pair[0]),
                        check_nonneg_real(f'{name}[{i}][1]', pair[1])))
    return tuple(checked)


def _check_triples(name, points, form):
    """Return ``[[int, int, seconds], ...]`` as a tuple of ``(int, int, float)`` triples.

    name: the field; form: how one row reads, for messages (e.g. ``[B, S, seconds]``).
    """
    if isinstance(points, (str, bytes)) or not isinstance(points, Iterable):
        raise TypeError(f'{name} must be a list of {form}, got {points!r}')
    checked = []
    for i, row in enumerate(points):
        if isinstance(row, (str, bytes)) or not isinstance(row, Iterable) or len(row) != 3:
            raise ValueError(f'{name}[{i}] must be {form}, got {row!r}')
        checked.append((check_int(f'{name}[{i}][0]', row[0]),
                        check_int(f'{name}[{i}][1]', row[1]),
                        check_nonneg_real(f'{name}[{i}][2]', row[2])))
    return tuple(checked)


def _check_created(value):
    """Return an ISO 8601 time string; raise unless ``value`` parses as one."""
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    check_text('created', value)
    try:
        datetime.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f'created must be an ISO 8601 time, got {value!r}') from None
    return value


def now_iso():
    """Return the current UTC time as an ISO 8601 string (seconds precision)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Fitted Eq. 4 coefficients with their key, fit report and raw measurements.

    Key: model_key, device, dtype, threads (see :func:`calibration_key`).
    Fit report: prefill_mape_pct / decode_mape_pct, percent, of a fit without the held-out
    points evaluated on them (None when no held-out point could be evaluated); n_points,
    measured points in all; profiling_s, seconds the profiling took; created, ISO 8601 time;
    method, ``full_grid``, ``startup`` or ``few_shot``.
    Raw grid: prefill_points ``((n_x tokens, t_s seconds), ...)`` and decode_points
    ``((n_kv tokens, t_s seconds per step), ...)``; :func:`fit_coefficients` refits them.
    batch_points: optional ``((B goals, S cached tokens in all, t_s seconds per step), ...)``
    of batched decoding (timing/batch.py; empty when not probed); :attr:`batch_step` fits them.
    prefix_points: optional ``((P cached tokens, N_x prompt tokens, t_s seconds), ...)`` of
    prefills that took their head from the prefix store (timing/prefix.py; empty when not
    probed); :attr:`copy_token_s` fits them.
    mask_step_s: seconds a json_schema token mask adds to a decoding step (engine/grammar.py's
    probe), or None when not probed.
    """

    coefficients: TimingCoefficients
    model_key: str
    device: str
    dtype: str
    threads: int
    prefill_mape_pct: Optional[float]
    decode_mape_pct: Optional[float]
    n_points: int
    profiling_s: float
    created: str
    method: str
    prefill_points: Tuple[Tuple[int, float], ...]
    decode_points: Tuple[Tuple[int, float], ...]
    batch_points: Tuple[Tuple[int, int, float], ...] = ()
    prefix_points: Tuple[Tuple[int, int, float], ...] = ()
    mask_step_s: Optional[float] = None

    def __post_init__(self):
        """Check every field, naming the bad one, and normalise types."""
        if not isinstance(self.coefficients, TimingCoefficients):
            raise TypeError(
                f'coefficients must be TimingCoefficients, got {self.coefficients!r}')
        checked = {
            'model_key': check_text('model_key', self.model_key),
            'device': check_text('device', self.device),
            'dtype': check_text('dtype', self.dtype),
            'threads': check_int('threads', self.threads),
            'prefill_mape_pct': _check_mape('prefill_mape_pct', self.prefill_mape_pct),
            'decode_mape_pct': _check_mape('decode_mape_pct', self.decode_mape_pct),
            'n_points': check_int('n_points', self.n_points),
            'profiling_s': check_nonneg_real('profiling_s', self.profiling_s),
            'created': _check_created(self.created),
            'prefill_points': _check_points('prefill_points', self.prefill_points),
            'decode_points': _check_points('decode_points', self.decode_points),
            'batch_points': _check_triples('batch_points', self.batch_points,
                                           '[B, S, seconds]'),
            'prefix_points': _check_triples('prefix_points', self.prefix_points,
                                            '[P, N_x, seconds]'),
            'mask_step_s': (None if self.mask_step_s is None
                            else check_nonneg_real('mask_step_s', self.mask_step_s)),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)
        if self.method not in METHODS:
            raise ValueError(f'method must be one of {METHODS}, got {self.method!r}')
        measured = len(self.prefill_points) + len(self.decode_points)
        if self.n_points != measured:
            raise ValueError(
                f'n_points ({self.n_points}) differs from the {measured} points in '
                'prefill_points and decode_points')

    @property
    def batch_step(self):
        """Return the fitted timing.batch.BatchStepCoefficients, or None without batch points."""
        if not self.batch_points:
            return None
        from timebill_ros.timing.batch import fit_batch_step
        return fit_batch_step(self.batch_points)

    @property
    def copy_token_s(self):
        """Return the prefix store's copy cost, seconds a prompt token (0 without points)."""
        from timebill_ros.timing.prefix import fit_copy_token_s
        return fit_copy_token_s(self.coefficients, self.prefix_points)

    @property
    def key(self):
        """Return this calibration's :func:`calibration_key`."""
        return calibration_key(self.model_key, self.device, self.dtype, self.threads)

    def to_dict(self):
        """Return a YAML-ready dict of plain Python types."""
        data = {'format_version': FORMAT_VERSION}
        for field in dataclasses.fields(self):
            data[field.name] = getattr(self, field.name)
        data['coefficients'] = self.coefficients.as_dict()
        for name in ('prefill_points', 'decode_points', 'batch_points', 'prefix_points'):
            data[name] = [list(pair) for pair in data[name]]
        return data

    @classmethod
    def from_dict(cls, data, source='calibration'):
        """Build a Calibration from :meth:`to_dict` output; ValueError names source and field."""
        if not isinstance(data, Mapping):
            raise ValueError(f'{source}: expected a mapping of fields, got {type(data).__name__}')
        if data.get('format_version') != FORMAT_VERSION:
            raise ValueError(f'{source}: field format_version must be {FORMAT_VERSION}, got '
                             f'{data.get("format_version")!r}')
        names = [field.name for field in dataclasses.fields(cls)
                 if field.name in data or field.default is dataclasses.MISSING]
        missing = [name for name in names if name not in data]
        if missing:
            raise ValueError(f'{source}: missing field(s) {", ".join(missing)}')
        kwargs = {name: data[name] for name in names}
        try:
            kwargs['coefficients'] = _coefficients_from(data['coefficients'])
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise ValueError(f'{source}: field {exc}') from exc

    def save(self, path):
        """Write this calibration as YAML to ``path`` atomically (temp file + os.replace)."""
        path = os.path.expanduser(os.fspath(path))
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        text = _YAML_HEADER + yaml.safe_dump(self.to_dict(), sort_keys=False,
                                             default_flow_style=None)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix='.calibration-', suffix='.tmp')
        try:
            with os.fdopen(fd, 'w', encoding='utf-8') as stream:
                stream.write(text)
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path):
        """Read a calibration YAML file; ValueError names the file and the bad field."""
        path = os.path.expanduser(os.fspath(path))
        with open(path, encoding='utf-8') as stream:
            try:
                data = yaml.safe_load(stream)
            except yaml.YAMLError as exc:
                raise ValueError(f'{path}: not valid YAML: {exc}') from exc
        return cls.from_dict(data, source=path)


def _coefficients_from(data):
    """Return TimingCoefficients from a ``{a, b, c, p, q}`` mapping."""
    if not isinstance(data, Mapping):
        raise TypeError(f'coefficients must be a mapping with {COEFFICIENT_NAMES}, got {data!r}')
    missing = [name for name in COEFFICIENT_NAMES if name not in data]
    if missing:
        raise ValueError(f'coefficients is missing {", ".join(missing)}')
    return TimingCoefficients(**{name: data[name] for name in COEFFICIENT_NAMES})
