"""The decoding step of B goals together: t_step(B, S) = q + r (B - 1) + p S.

Eq. 4b (TimeBill) times one goal's step, t(N_kv) = p N_kv + q. With B goals decoding
together (engine/decode_batch.py) the weights are read once a step, each extra row adds its
own compute (r, seconds per extra goal) and attention reads every row's cache, so the step is
linear in the batch's total cached tokens S = sum of the rows' N_kv (p, seconds per token).
Fitted by least squares (numpy.linalg.lstsq) on probes at several B and KV lengths; the
profiler measures them and the calibration file keeps the raw points.
"""

import dataclasses

import numpy as np

from timebill_ros.timing.probes import probes_of

BATCH_SIZES = (1, 2, 4, 8)
BATCH_KV = (128, 1024)  # cached tokens per row of a probe


@dataclasses.dataclass(frozen=True)
class BatchStepCoefficients:
    """t_step(B, S) = q + r (B - 1) + p S; q, r in seconds, p in seconds per cached token."""

    q: float
    r: float
    p: float

    def step_s(self, batch_size: int, total_kv: int) -> float:
        """Seconds of one step of ``batch_size`` goals holding ``total_kv`` cached tokens."""
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f'batch_size must be an int >= 1, got {batch_size!r}')
        if total_kv < 0:
            raise ValueError(f'total_kv must be >= 0, got {total_kv!r}')
        return self.q + self.r * (batch_size - 1) + self.p * total_kv

    def per_token_s(self, batch_size: int, total_kv: int) -> float:
        """Seconds per generated token (the step shared by ``batch_size`` goals)."""
        return self.step_s(batch_size, total_kv) / batch_size


def fit_batch_step(points) -> BatchStepCoefficients:
    """Fit q, r, p to ``points`` ``((B, S tokens, t_s seconds), ...)``.

    Needs at least two batch sizes and two totals S; raises ValueError otherwise. Negative
    fitted terms (noise) are clamped to 0 and the rest refitted.
    """
    rows = [(int(b), float(s), float(t)) for b, s, t in points]
    if len({b for b, _, _ in rows}) < 2 or len({s for _, s, _ in rows}) < 2:
        raise ValueError(f'need points at two or more batch sizes and totals, got {rows!r}')
    design = np.array([[1.0, b - 1.0, s] for b, s, _ in rows])
    times = np.array([t for _, _, t in rows])
    keep = [0, 1, 2]
    while True:
        solution, *_ = np.linalg.lstsq(design[:, keep], times, rcond=None)
        negative = [k for k, value in zip(keep, solution) if value < 0 and k != 0]
        if not negative:
            break
        keep = [k for k in keep if k not in negative]
    coefficients = dict.fromkeys((0, 1, 2), 0.0)
    coefficients.update(zip(keep, (float(v) for v in solution)))
    return BatchStepCoefficients(q=coefficients[0], r=coefficients[1], p=coefficients[2])


def probe_batches(engine, sizes=BATCH_SIZES, kv_lengths=BATCH_KV, steps=4, progress=None):
    """Measure one decoding step of B goals on ``engine``; return ``[(B, S, t_s)]``.

    Each row of a probe is a prefill of ``n_kv`` random tokens (not timed); the steps run
    through the engine's own batch (stop checks included). Sizes above the engine's forward
    ``max_batch`` are skipped.
    """
    points, probes = [], probes_of(engine)
    for n_kv in kv_lengths:
        for size in sizes:
            if size > engine.forward.max_batch:
                continue
            seconds = probes.measure_batch_step_s(size, n_kv, steps)
            points.append((size, size * (n_kv + 1), seconds))
            if progress is not None:
                progress(f'batch B={size} N_kv={n_kv}: {seconds:.4f} s/step')
    return points


def step_scale(coefficients, batch_size, kv_lengths=BATCH_KV) -> float:
    """Return how much longer one goal's decoding step is in a batch of ``batch_size``.

    The ratio t_step(B, B n) / t_step(1, n) (dimensionless, >= 1 for a sane fit), the
    largest over the per-goal KV lengths n of ``kv_lengths``: a batch's goals may hold any
    of them, and a budget must not count on the smallest slow-down. Without a fit
    (``coefficients`` None) it is ``batch_size``: no gain from batching is assumed.
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f'batch_size must be an int >= 1, got {batch_size!r}')
    if batch_size == 1:
        return 1.0
    if coefficients is None:
        return float(batch_size)
    ratios = [coefficients.step_s(batch_size, batch_size * n) / coefficients.step_s(1, n)
              for n in kv_lengths if coefficients.step_s(1, n) > 0]
    return max([1.0] + ratios)


def choose_batch_size(coefficients, sizes, gain_share, kv_lengths=BATCH_KV) -> int:
    """Return C_f for ``scheduler.batch_size: 0``: where batching stops paying.

    The CPU analogue of RT-LM's "smallest batch at which the GPU is fully used" (Sec. V): the
    smallest B of ``sizes`` (the batch sizes probed, ascending) whose per-token cost
    t_step(B', B' n) / B' at the next size B' falls by less than ``gain_share`` (in (0, 1))
    of its own, for every per-goal KV length n of ``kv_lengths``; the largest size when every
    step still pays. Only probed sizes are candidates: the fit is not trusted beyond them.
    """
    if not 0 < gain_share < 1:
        raise ValueError(f'gain_share must be in (0, 1), got {gain_share!r}')
    sizes = sorted(set(sizes))
    if not sizes or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in sizes):
        raise ValueError(f'sizes must be ints >= 1, got {sizes!r}')
    for size, bigger in zip(sizes, sizes[1:]):
        pays = False
        for n in kv_lengths:
            now = coefficients.per_token_s(size, size * n)
            if now > 0 and coefficients.per_token_s(bigger, bigger * n) < (1 - gain_share) * now:
                pays = True
        if not pays:
            return size
    return sizes[-1]


class BatchScale:
    """The step scale goals in a batch budget with: the fit's, raised by what batches showed.

    The batched-step fit is probed on the bare engine; in the server each goal's step also
    carries its stop checks, feedback and detokenisation, so batched steps run slower than
    the fit says (measured here: 1.7x a step alone at B = 4 against the fit's 1.45x). Each
    goal that decoded in a batch reports its mean step over the time model's step alone at
    its cache length; per batch size, an exponential moving average (weight ``weight``) of
    those ratios is kept, and :meth:`scale` is the larger of it and :func:`step_scale`.
    """

    def __init__(self, coefficients=None, weight=0.3):
        """Start from ``coefficients`` (BatchStepCoefficients or None); 0 < weight <= 1."""
        if not 0 < weight <= 1:
            raise ValueError(f'weight must be in (0, 1], got {weight!r}')
        self.coefficients = coefficients
        self.weight = float(weight)
        self.learned = {}

    def scale(self, batch_size):
        """Return a goal's step in a batch of ``batch_size`` over its step alone (>= 1)."""
        fitted = step_scale(self.coefficients, batch_size)
        return max(fitted, self.learned.get(batch_size, 0.0)) if batch_size > 1 else 1.0

    def observe(self, batch_size, ratio):
        """Record one goal's measured batched step over its step alone (dimensionless)."""
        if batch_size < 2 or not ratio > 0:
            return
        old = self.learned.get(batch_size)
        self.learned[batch_size] = ratio if old is None else \
            old + self.weight * (ratio - old)


class ScaledSteps:
    """A time model (timing.online.TimeModel) whose decoding steps take ``scale`` x longer.

    What a goal in a decoding batch budgets with: step_s, decode_s and decode_coefficients
    are scaled; every other estimate (prefill, predictor, eviction) is the model's own.
    """

    def __init__(self, model, scale: float):
        """Wrap ``model``; ``scale`` > 0 (dimensionless)."""
        if not scale > 0:
            raise ValueError(f'scale must be > 0, got {scale!r}')
        self.model = model
        self.scale = float(scale)

    def step_s(self, n_kv, bound='expected'):
        """Seconds of one decoding step with ``n_kv`` cached tokens, in the batch."""
        return self.scale * self.model.step_s(n_kv, bound)

    def decode_s(self, n_x, alpha, n_tokens, bound='expected'):
        """Seconds of an ``n_tokens`` decoding phase at eviction ratio ``alpha``, batched."""
        return self.scale * self.model.decode_s(n_x, alpha, n_tokens, bound)

    def decode_coefficients(self, bound='worst'):
        """Eq. 4 with the decoding coefficients p, q scaled (what alpha* is solved with)."""
        co = self.model.decode_coefficients(bound)
        return dataclasses.replace(co, p=co.p * self.scale, q=co.q * self.scale)

    def __getattr__(self, name):
        return getattr(self.model, name)
