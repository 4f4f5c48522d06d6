"""One timed generation (a *probe*): prefill time and per-step decode times.

A probe prefills ``n_in`` prompt tokens (the first answer token comes out of the prefill) and
then runs ``n_out - 1`` decoding steps with EOS ignored, so its output length is exactly
``n_out``. Decoding step i (i = 1 .. n_out - 1) runs with ``n_in + i - 1`` tokens cached, as in
TimeBill Eq. 5 with alpha = 0.
"""

import dataclasses
import math
from typing import Tuple

from timebill_ros.checks import check_int, check_nonneg_real


@dataclasses.dataclass(frozen=True)
class Probe:
    """Timings of one generation of exactly ``n_out`` tokens after an ``n_in``-token prompt.

    n_in: prompt tokens. n_out: answer tokens, >= 1.
    ttft_s: prefill time, seconds (time to first token).
    step_s: seconds of each decoding step, length n_out - 1; step i (1-based) had
        ``n_in + i - 1`` tokens cached.
    """

    n_in: int
    n_out: int
    ttft_s: float
    step_s: Tuple[float, ...]

    def __post_init__(self):
        """Check every field, naming the bad one."""
        object.__setattr__(self, 'n_in', check_int('n_in', self.n_in, 1))
        object.__setattr__(self, 'n_out', check_int('n_out', self.n_out, 1))
        object.__setattr__(self, 'ttft_s', check_nonneg_real('ttft_s', self.ttft_s))
        steps = tuple(check_nonneg_real(f'step_s[{i}]', s) for i, s in enumerate(self.step_s))
        if len(steps) != self.n_out - 1:
            raise ValueError(f'step_s must hold n_out - 1 = {self.n_out - 1} decoding steps, '
                             f'got {len(steps)}')
        object.__setattr__(self, 'step_s', steps)

    @property
    def decode_s(self):
        """Seconds of the decoding phase: the sum of the step times."""
        return math.fsum(self.step_s)

    @property
    def e2e_s(self):
        """End-to-end seconds: prefill plus decoding (this is also what measuring it cost)."""
        return self.ttft_s + self.decode_s

    @property
    def n_kv_steps(self):
        """Cached tokens at each decoding step, ``(n_in, n_in + 1, ...)``, length n_out - 1."""
        return tuple(range(self.n_in, self.n_in + self.n_out - 1))

    def truncated(self, n_out):
        """Return this probe cut to its first ``n_out`` answer tokens (a prefix of the run)."""
        n_out = check_int('n_out', n_out, 1)
        if n_out > self.n_out:
            raise ValueError(f'n_out must be <= {self.n_out}, got {n_out}')
        return Probe(self.n_in, n_out, self.ttft_s, self.step_s[:n_out - 1])

    def to_dict(self):
        """Return a JSON-ready dict."""
        return {'n_in': self.n_in, 'n_out': self.n_out, 'ttft_s': self.ttft_s,
                'step_s': list(self.step_s)}

    @classmethod
    def from_dict(cls, data):
        """Build a Probe from :meth:`to_dict` output."""
        return cls(data['n_in'], data['n_out'], data['ttft_s'], tuple(data['step_s']))


def timed_probe(engine, n_in, n_out):
    """Return ``engine.measure_probe(n_in, n_out)`` after checking it is a matching Probe."""
    probe = engine.measure_probe(n_in, n_out)
    if not isinstance(probe, Probe) or (probe.n_in, probe.n_out) != (n_in, n_out):
        raise RuntimeError(f'engine.measure_probe({n_in}, {n_out}) returned {probe!r}')
    return probe
