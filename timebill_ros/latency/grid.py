"""The raw latency grid: probes over prompt lengths, repeated, saved as JSON and CSV.

Each recorded run prefills ``n_in`` tokens and decodes ``n_out_max`` tokens; the latency of
any shorter answer ``n_out`` is read from the same run (:meth:`Probe.truncated`), which is
what a robot waiting for an ``n_out``-token answer would have seen.
"""

import csv
import dataclasses
import json
import os
from typing import Optional, Sequence, Tuple

import numpy as np

from timebill_ros.engine.probe import Probe
from timebill_ros.checks import check_int

FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class GridRun:
    """One recorded probe: repeat index, position in the measuring order, the probe."""

    repeat: int
    order: int
    probe: Probe


@dataclasses.dataclass(frozen=True)
class LatencyGrid:
    """Recorded runs plus metadata (model key, device, dtype, threads, settings, wall time).

    Every n_in has one run per repeat, all with the same n_out_max.
    """

    runs: Tuple[GridRun, ...]
    meta: dict

    def __post_init__(self):
        """Check the runs form a full grid (every n_in once per repeat, one n_out_max)."""
        runs = tuple(self.runs)
        if not runs:
            raise ValueError('a LatencyGrid needs at least one run')
        n_outs = {run.probe.n_out for run in runs}
        if len(n_outs) != 1:
            raise ValueError(f'all runs must decode the same n_out_max, got {sorted(n_outs)}')
        keys = [(run.repeat, run.probe.n_in) for run in runs]
        if len(set(keys)) != len(keys):
            raise ValueError('each (repeat, n_in) may be recorded once')
        expected = {(r, n) for r in {k[0] for k in keys} for n in {k[1] for k in keys}}
        if set(keys) != expected:
            raise ValueError(f'grid is incomplete: missing (repeat, n_in) '
                             f'{sorted(expected - set(keys))[:5]}')
        object.__setattr__(self, 'runs', runs)

    @property
    def n_in_values(self):
        """Prompt lengths measured, tokens, increasing."""
        return tuple(sorted({run.probe.n_in for run in self.runs}))

    @property
    def repeats(self):
        """Repeat indices, increasing."""
        return tuple(sorted({run.repeat for run in self.runs}))

    @property
    def n_out_max(self):
        """Tokens every run decoded."""
        return self.runs[0].probe.n_out

    def probe(self, n_in, n_out, repeat):
        """Return the probe of ``repeat`` at ``n_in`` cut to ``n_out`` answer tokens."""
        for run in self.runs:
            if run.repeat == repeat and run.probe.n_in == n_in:
                return run.probe.truncated(n_out)
        raise KeyError(f'no run at n_in={n_in}, repeat={repeat}')

    def e2e_s(self, n_in, n_out, repeats: Optional[Sequence[int]] = None):
        """Return the mean end-to-end seconds at (n_in, n_out) over ``repeats`` (None = all)."""
        chosen = self.repeats if repeats is None else tuple(repeats)
        return float(np.mean([self.probe(n_in, n_out, r).e2e_s for r in chosen]))

    def ttft_s(self, n_in, repeats: Optional[Sequence[int]] = None):
        """Return the mean prefill seconds at ``n_in`` over ``repeats`` (None = all)."""
        return self.e2e_s(n_in, 1, repeats)

    def step_s(self, n_kv, repeats: Optional[Sequence[int]] = None):
        """Return the mean seconds of a decoding step with ``n_kv`` cached tokens.

        Averaged over every recorded step that ran with exactly ``n_kv`` tokens cached (the
        first step of the run at n_in = n_kv, the second at n_kv - 1, ...).
        """
        chosen = self.repeats if repeats is None else tuple(repeats)
        values = [run.probe.step_s[n_kv - run.probe.n_in] for run in self.runs
                  if run.repeat in chosen and 0 <= n_kv - run.probe.n_in < run.probe.n_out - 1]
        if not values:
            raise KeyError(f'no decoding step was recorded with n_kv={n_kv}')
        return float(np.mean(values))

    def measuring_s(self, repeats: Optional[Sequence[int]] = None):
        """Return the seconds spent generating in ``repeats`` (None = all), cool-down excluded."""
        chosen = self.repeats if repeats is None else tuple(repeats)
        return float(sum(run.probe.e2e_s for run in self.runs if run.repeat in chosen))

    def to_dict(self):
        """Return a JSON-ready dict."""
        return {'format_version': FORMAT_VERSION, 'meta': dict(self.meta),
                'runs': [{'repeat': r.repeat, 'order': r.order, **r.probe.to_dict()}
                         for r in self.runs]}

    @classmethod
    def from_dict(cls, data):
        """Build a LatencyGrid from :meth:`to_dict` output; ValueError on another format."""
        if not isinstance(data, dict) or data.get('format_version') != FORMAT_VERSION:
            raise ValueError(f'not a latency grid of format_version {FORMAT_VERSION}')
        runs = tuple(GridRun(check_int('repeat', r['repeat'], 0),
                             check_int('order', r['order'], 0), Probe.from_dict(r))
                     for r in data['runs'])
        return cls(runs, dict(data.get('meta', {})))

    def save(self, path):
        """Write the grid as JSON (all step times) to ``path``."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, 'w', encoding='utf-8') as stream:
            json.dump(self.to_dict(), stream, separators=(',', ':'))
            stream.write('\n')

    @classmethod
    def load(cls, path):
        """Read a grid written by :meth:`save`."""
        with open(path, encoding='utf-8') as stream:
            return cls.from_dict(json.load(stream))

    def save_csv(self, path, n_out_values):
        """Write one row per run and answer length: repeat, order, n_in, n_out, ttft_s, e2e_s."""
        with open(path, 'w', encoding='utf-8', newline='') as stream:
            writer = csv.writer(stream)
            writer.writerow(['repeat', 'order', 'n_in', 'n_out', 'ttft_s', 'e2e_s'])
            for run in sorted(self.runs, key=lambda r: (r.repeat, r.probe.n_in)):
                for n_out in n_out_values:
                    probe = run.probe.truncated(n_out)
                    writer.writerow([run.repeat, run.order, probe.n_in, n_out,
                                     f'{probe.ttft_s:.6f}', f'{probe.e2e_s:.6f}'])
