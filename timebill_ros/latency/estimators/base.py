"""Base class of latency predictors and the fitted model they return.

A predictor turns a few measured :class:`~timebill_ros.engine.probe.Probe` s into a
:class:`LatencyModel`, which predicts the TimeBill pieces (prefill seconds at n_in tokens,
one decoding step's seconds at n_kv cached tokens) and the end-to-end latency
L(n_in, n_out), seconds, of an n_out-token answer.
"""

import abc
import dataclasses
from typing import Callable, Optional, Sequence

import numpy as np

from timebill_ros.engine.probe import Probe
from timebill_ros.checks import check_int
from timebill_ros.timing.model import TimingCoefficients

STEPS = 'steps'    # n_out - 1 decoding steps, step i at n_in + i - 1 cached (TimeBill Eq. 5-7)
TOKENS = 'tokens'  # n_out tokens at step(n_in) each (SimFLi Eq. 2: coef_decode * n_out)


@dataclasses.dataclass(frozen=True)
class LatencyModel:
    """A fitted latency model.

    prefill: n_in (tokens, float array) -> prefill seconds (array of the same shape).
    step: n_kv (tokens, float array) -> seconds of one decoding step.
    constant_s: seconds added to every end-to-end prediction (SimFLi's C).
    decode_count: ``steps`` (TimeBill) or ``tokens`` (SimFLi), see :meth:`e2e_s`.
    coefficients: the same model as Eq. 4 coefficients when it has that form, else None.
    """

    prefill: Callable[[np.ndarray], np.ndarray]
    step: Callable[[np.ndarray], np.ndarray]
    constant_s: float = 0.0
    decode_count: str = STEPS
    coefficients: Optional[TimingCoefficients] = None

    def __post_init__(self):
        """Check decode_count."""
        if self.decode_count not in (STEPS, TOKENS):
            raise ValueError(f'decode_count must be {STEPS!r} or {TOKENS!r}, '
                             f'got {self.decode_count!r}')

    def prefill_s(self, n_in):
        """Return predicted prefill seconds at ``n_in`` tokens (scalar or array)."""
        return self.prefill(np.asarray(n_in, dtype=float))

    def step_s(self, n_kv):
        """Return predicted seconds of one decoding step with ``n_kv`` cached tokens."""
        return self.step(np.asarray(n_kv, dtype=float))

    def decode_s(self, n_in, n_out):
        """Return predicted decoding seconds of an ``n_out``-token answer (scalar ints).

        ``steps``: sum of step(n_in + i - 1) over i = 1 .. n_out - 1.
        ``tokens``: n_out * step(n_in).
        """
        n_in, n_out = check_int('n_in', n_in, 1), check_int('n_out', n_out, 1)
        if self.decode_count == TOKENS:
            return float(n_out * self.step_s(n_in))
        return float(np.sum(self.step_s(np.arange(n_in, n_in + n_out - 1))))

    def e2e_s(self, n_in, n_out):
        """Return predicted end-to-end seconds L(n_in, n_out) (scalar ints)."""
        return float(self.prefill_s(n_in)) + self.decode_s(n_in, n_out) + self.constant_s


def model_from_coefficients(coefficients):
    """Return the :class:`LatencyModel` of Eq. 4 coefficients (TimeBill's form)."""
    co = coefficients
    return LatencyModel(prefill=lambda n: co.a * n * n + co.b * n + co.c,
                        step=lambda n: co.p * n + co.q, coefficients=co)


def check_probes(probes, minimum):
    """Return ``probes`` as a tuple; raise unless it holds >= ``minimum`` Probe objects."""
    probes = tuple(probes)
    bad = [p for p in probes if not isinstance(p, Probe)]
    if bad:
        raise TypeError(f'probes must be Probe objects, got {bad[0]!r}')
    if len(probes) < minimum:
        raise ValueError(f'need >= {minimum} probes, got {len(probes)}')
    return probes


def probe_arrays(probes):
    """Return float arrays (n_in, n_out, ttft_s, decode_s, e2e_s) of ``probes``."""
    return tuple(np.array([getattr(p, name) for p in probes], dtype=float)
                 for name in ('n_in', 'n_out', 'ttft_s', 'decode_s', 'e2e_s'))


class LatencyPredictor(abc.ABC):
    """Fits a :class:`LatencyModel` to measured probes. Override :meth:`fit`."""

    name = ''
    min_probes = 1

    @abc.abstractmethod
    def fit(self, probes: Sequence[Probe]) -> LatencyModel:
        """Return the model fitted to ``probes`` (at least ``min_probes`` of them)."""
