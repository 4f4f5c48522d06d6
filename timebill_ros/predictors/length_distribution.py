"""Reading a length out of the RLP's bucket distribution: argmax, median or an upper quantile.

The classification head gives a distribution over ceil(N_model / B) buckets (softmax of its
logits). TimeBill reads the argmax (the most likely bucket, Eq. 2). Answer lengths are long-
tailed once N_model reaches 1024 tokens (a small model often rambles to the cap), and the
argmax then sits in the short mode while MAE is minimised by the median; and a WCET wants
an upper quantile q (the length the answer stays under with probability q), which the
same distribution gives for free. Shared by the trainer (training/heads/rlp.py) and the server's
ONNX predictor, so both read the same way.
"""

import dataclasses
import math
from typing import Dict, Optional

import numpy as np

READOUTS = ('argmax', 'median')


def bucket_cdf(logits) -> np.ndarray:
    """Return the cumulative softmax of ``logits`` (C,), each entry in (0, 1], last == 1."""
    values = np.asarray(logits, dtype=np.float64).reshape(-1)
    weights = np.exp(values - values.max())
    cdf = np.cumsum(weights / weights.sum())
    cdf[-1] = 1.0
    return cdf


def quantile_bucket(logits, q: float) -> int:
    """Return the first bucket whose cumulative probability reaches ``q`` (0 < q <= 1)."""
    if not 0.0 < q <= 1.0:
        raise ValueError(f'q must be in (0, 1], got {q!r}')
    return int(np.searchsorted(bucket_cdf(logits), q - 1e-12))


def read_bucket(logits, readout: str) -> int:
    """Return the bucket the point prediction reads: ``argmax`` or ``median`` (q = 0.5)."""
    if readout == 'argmax':
        return int(np.argmax(np.asarray(logits).reshape(-1)))
    if readout == 'median':
        return quantile_bucket(logits, 0.5)
    raise ValueError(f'readout must be one of {READOUTS}, got {readout!r}')


def parse_quantile_levels(text: str) -> tuple:
    """Parse ``0.9:0.95,0.99:0.999`` (q:level pairs) into ((0.9, 0.95), ...) sorted by q.

    ValueError names a malformed pair or a value outside (0, 1].
    """
    pairs = []
    for part in filter(None, (p.strip() for p in str(text).split(','))):
        try:
            q, level = (float(v) for v in part.split(':'))
        except ValueError:
            raise ValueError(f'quantile_levels: {part!r} is not q:level') from None
        if not (0.0 < q <= 1.0 and 0.0 < level <= 1.0):
            raise ValueError(f'quantile_levels: {part!r} is outside (0, 1]')
        pairs.append((q, level))
    return tuple(sorted(pairs))


@dataclasses.dataclass(frozen=True)
class OutputFormat:
    """How an exported predictor's output becomes tokens (its ONNX ``timebill.*`` metadata).

    kind: ``classification`` (bucket logits or log-probabilities, (C,)) or ``regression``
    (one value, the length / N_model). bucket_tokens: B, tokens. n_model: N_model, tokens.
    readout: ``argmax`` or ``median``. quantile_levels: ((q, level), ...) sorted by q: the
    distribution's level to read when N^_q is asked for, calibrated at the build on held-out
    prompts (the lowest level whose N^ covered a share q of them, never below q); empty: q.
    """

    kind: str
    bucket_tokens: int
    n_model: int
    readout: str
    quantile_levels: tuple = ()

    @classmethod
    def from_metadata(cls, meta: Dict[str, str]) -> 'OutputFormat':
        """Read the format from export metadata; ValueError when it is not a timebill export."""
        try:
            # Files exported before the readout was stored read the argmax, as they were trained.
            return cls(meta['kind'], int(meta['bucket_tokens']), int(meta['n_model']),
                       meta.get('readout', 'argmax'),
                       parse_quantile_levels(meta.get('quantile_levels', '')))
        except (KeyError, ValueError) as exc:
            raise ValueError(f'not a timebill RLP export (metadata {meta!r})') from exc

    def to_tokens(self, output, n_max: int, q: Optional[float] = None) -> int:
        """Eq. 2 post-processing: N^ = min(N_max, n^ B); the censored top bucket gives N_max.

        output: the raw output (C,). q: read the q-quantile bucket instead of the readout
        (classification only).
        """
        if self.kind == 'regression':
            length = float(output[0]) * self.n_model
            top = length >= self.n_model
            n_hat = max(1, math.ceil(length))
        else:
            bucket = read_bucket(output, self.readout) if q is None else quantile_bucket(output, q)
            top = bucket == len(output) - 1
            n_hat = (bucket + 1) * self.bucket_tokens
        if top:  # ">= N_model": the true length may be anything up to N_max
            return n_max
        return int(min(n_max, n_hat))

    def level(self, q: float) -> float:
        """Return the distribution level read for N^_q (never below ``q``).

        The calibrated level of the smallest calibrated q' >= q, else ``q`` itself.
        """
        for calibrated_q, level in self.quantile_levels:
            if calibrated_q >= q - 1e-9:
                return max(q, level)
        return q

    def bounds(self, output, n_max: int, q: Optional[float] = None) -> tuple:
        """Return (N^, N^_q) of one output, tokens; N^_q None without ``q`` or a distribution.

        N^_q reads the calibrated level of ``q`` (:meth:`level`).
        """
        upper = (None if not q or self.kind == 'regression'
                 else self.to_tokens(output, n_max, self.level(q)))
        return self.to_tokens(output, n_max), upper

    def rest_bounds(self, output, n_max: int, n_done: int, q: float) -> Optional[tuple]:
        """Return (N^_rem, N^_rem,q), tokens still to come after ``n_done``, or None.

        The length distribution conditioned on the answer being longer than ``n_done``
        tokens (it has not ended yet): each bucket's probability times the share of its
        lengths above ``n_done`` (uniform within a bucket); N^_rem reads the median, N^_rem,q
        the calibrated level of ``q``; the top bucket reads N_max. None for a regression
        output or when no probability is left above ``n_done``: the caller's fallback.
        """
        if self.kind == 'regression' or not 0 < q < 1:
            return None
        probs = np.diff(np.concatenate([[0.0], bucket_cdf(output)]))
        tokens = self.bucket_tokens
        lower = np.arange(len(probs)) * tokens
        above = np.clip((lower + tokens - n_done) / tokens, 0.0, 1.0)
        above[-1] = 1.0 if n_done < n_max else 0.0  # ">= N_model": up to N_max
        weights = probs * above
        if weights.sum() <= 0:
            return None
        cdf = np.cumsum(weights / weights.sum())

        def rest(level):
            bucket = int(np.searchsorted(cdf, level - 1e-12))
            end = n_max if bucket == len(probs) - 1 else min(n_max, (bucket + 1) * tokens)
            return max(1, end - n_done)

        return rest(0.5), rest(self.level(q))
