"""Score latency predictors on a measured grid (SimFLi Tables 3-4, TimeBill's pieces).

For each repeat r of the grid, every method picks its probes from repeat r's in-distribution
cells, fits, and is scored against the mean of the *other* repeats, so no method is scored
on the very measurements it was fitted to. Scores: R^2, RMSE and MAE (seconds) and MAPE (%)
of L(n_in, n_out) on the in-distribution and held-out cells; MAPE of t^_prefill over every
prompt length and of t^_decode-step (each run's mean step time over its n_kv range). Cost:
seconds of generation the method's measurements took on this machine.
"""

import dataclasses
from typing import Callable, Optional, Tuple

import numpy as np

from timebill_ros.latency.estimators.base import LatencyPredictor
from timebill_ros.timing.selection import exponential_inputs, fsp_inputs, output_lengths

EXPONENTIAL = 'exponential'
FSP = 'fsp'
FULL_GRID = 'full_grid'
NONE = 'none'
SPLITS = ('id', 'heldout', 'all')


@dataclasses.dataclass(frozen=True)
class Method:
    """A predictor plus how it chooses its probes (exponential, fsp, full_grid or none)."""

    name: str
    predictor: LatencyPredictor
    selection: str
    extra_cost_s: float = 0.0  # e.g. the roofline's hardware measurement, seconds

    def __post_init__(self):
        """Check the selection."""
        if self.selection not in (EXPONENTIAL, FSP, FULL_GRID, NONE):
            raise ValueError(f'unknown selection {self.selection!r}')


def scores(predicted, measured):
    """Return R^2, RMSE (s), MAE (s) and MAPE (%) of ``predicted`` against ``measured``."""
    predicted = np.asarray(predicted, dtype=float)
    measured = np.asarray(measured, dtype=float)
    if predicted.shape != measured.shape or measured.size < 2:
        raise ValueError('predicted and measured must match in shape, with >= 2 values')
    error = predicted - measured
    total = np.sum((measured - measured.mean()) ** 2)
    return {'r2': float(1.0 - np.sum(error ** 2) / total) if total > 0 else float('nan'),
            'rmse': float(np.sqrt(np.mean(error ** 2))), 'mae': float(np.mean(np.abs(error))),
            'mape': float(np.mean(np.abs(error) / np.abs(measured)) * 100.0)}


@dataclasses.dataclass(frozen=True)
class Target:
    """Measured means the predictions are scored against (seconds)."""

    e2e: dict            # (n_in, n_out) -> seconds
    ttft: dict           # n_in -> seconds
    mean_step: dict      # n_in -> mean seconds of that run's decoding steps

    @classmethod
    def of(cls, grid, design, repeats):
        """Average ``repeats`` of ``grid`` over every cell of ``design``."""
        e2e = {cell: grid.e2e_s(*cell, repeats) for cell in design.cells('all')}
        ttft = {n: grid.ttft_s(n, repeats) for n in design.n_in_values}
        mean_step = {n: float(np.mean([np.mean(grid.probe(n, grid.n_out_max, r).step_s)
                                       for r in repeats])) for n in design.n_in_values}
        return cls(e2e, ttft, mean_step)


def score_model(model, target, design, n_out_max):
    """Return {split: scores} of L, plus ``prefill_mape`` and ``step_mape`` (%)."""
    result = {}
    for split in SPLITS:
        cells = design.cells(split)
        result[split] = scores([model.e2e_s(*c) for c in cells], [target.e2e[c] for c in cells])
    n_in = np.array(design.n_in_values, dtype=float)
    result['prefill_mape'] = scores(model.prefill_s(n_in),
                                    [target.ttft[n] for n in design.n_in_values])['mape']
    step_hat = [float(np.mean(model.step_s(np.arange(n, n + n_out_max - 1))))
                for n in design.n_in_values]
    result['step_mape'] = scores(step_hat, [target.mean_step[n]
                                            for n in design.n_in_values])['mape']
    return result


def choose_probes(method, grid, design, repeat, k, seed):
    """Return (probes, cost_s, inputs) of ``method`` on ``repeat`` of ``grid``."""
    if method.selection == NONE:
        return (), method.extra_cost_s, ()
    if method.selection == FULL_GRID:
        probes = [grid.probe(n, design.id_n_out[-1], repeat) for n in design.id_n_in]
        return probes, sum(p.e2e_s for p in probes) + method.extra_cost_s, design.id_n_in
    outputs = output_lengths(design.probe_n_out, k, seed)
    trace_cost = 0.0
    if method.selection == EXPONENTIAL:
        inputs = exponential_inputs(design.id_n_in, k)
    else:
        inputs, trace = fsp_inputs(design.id_n_in, k, lambda n: grid.ttft_s(n, [repeat]))
        trace_cost = sum(grid.ttft_s(n, [repeat]) for n in trace)
    probes = [grid.probe(n, o, repeat) for n, o in zip(inputs, outputs)]
    cost = trace_cost + sum(p.e2e_s for p in probes) + method.extra_cost_s
    return probes, cost, inputs


@dataclasses.dataclass(frozen=True)
class MethodResult:
    """Scores of one method fitted on one repeat (``repeat``) of the grid."""

    method: str
    repeat: int
    cost_s: float
    inputs: Tuple[int, ...]
    scores: dict


def evaluate(grid, design, methods, k=5, seed=0,
             progress: Optional[Callable[[str], None]] = None):
    """Fit and score every method on every repeat; return a list of :class:`MethodResult`."""
    results = []
    for repeat in grid.repeats:
        others = [r for r in grid.repeats if r != repeat] or [repeat]
        target = Target.of(grid, design, others)
        for method in methods:
            probes, cost, inputs = choose_probes(method, grid, design, repeat, k, seed)
            model = method.predictor.fit(probes)
            results.append(MethodResult(method.name, repeat, cost, tuple(inputs),
                                        score_model(model, target, design, grid.n_out_max)))
            if progress:
                progress(f'repeat {repeat}: {method.name} fitted on {list(inputs)}')
    return results


def mean_scores(results, method):
    """Return the mean over repeats of ``method``'s scores, and its mean cost (seconds)."""
    rows = [r for r in results if r.method == method]
    if not rows:
        raise KeyError(f'no results for {method!r}')
    first = rows[0].scores

    def avg(get):
        return float(np.mean([get(r.scores) for r in rows]))
    merged = {key: ({m: avg(lambda s, key=key, m=m: s[key][m]) for m in first[key]}
                    if isinstance(first[key], dict) else avg(lambda s, key=key: s[key]))
              for key in first}
    return merged, float(np.mean([r.cost_s for r in rows]))
