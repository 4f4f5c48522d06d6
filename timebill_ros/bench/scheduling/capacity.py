"""How fast the machine serves: the run's calibration and each subset's capacity.

The pure parts pick the capacity sample and fit its measured service times; ``measure_capacity``
and ``calibrate`` need the model (and, for the capacity, a running server).
"""

import statistics

import numpy as np

from timebill_ros.server.status import POLICY_KILL

CAPACITY_SAMPLE = 6
CAPACITY_BUDGET_S = 600.0
CALIBRATION_MAPE_PCT = 25.0  # a fit worse than this (held out) is profiled again / flagged


def capacity_sample(predicted_s, k=CAPACITY_SAMPLE):
    """Return the indices of ``k`` goals spread evenly over the ranks of ``predicted_s``."""
    order = sorted(range(len(predicted_s)), key=lambda i: (predicted_s[i], i))
    if k >= len(order):
        return order
    return [order[round(j * (len(order) - 1) / (k - 1))] for j in range(k)] if k > 1 \
        else [order[len(order) // 2]]


def fit_service(sample_predicted_s, sample_measured_s):
    """Return (scale, overhead_s): measured service time ~ scale x t^_e2e + overhead_s.

    Least squares over the sample. The overhead is what each goal costs beyond the time
    model (ROS round trip, chat template, predictor, admission), seconds; it matters for short
    goals. When the sample's t^_e2e are too alike to separate the two (largest < 1.5 x the
    smallest) or the fit gives a term < 0, the overhead is 0 and the scale is
    sum(measured) / sum(predicted).
    """
    pred = np.asarray(sample_predicted_s, dtype=float)
    meas = np.asarray(sample_measured_s, dtype=float)
    if pred.size == 0 or pred.shape != meas.shape or pred.sum() <= 0:
        raise ValueError('the capacity sample has no measured or predicted time')
    ratio = float(meas.sum() / pred.sum())
    if pred.size < 3 or pred.max() < 1.5 * pred.min():
        return ratio, 0.0
    (scale, overhead), *_ = np.linalg.lstsq(np.column_stack([pred, np.ones_like(pred)]), meas,
                                            rcond=None)
    if scale <= 0 or overhead < 0:
        return ratio, 0.0
    return float(scale), float(overhead)


def estimate_capacity(sample_predicted_s, sample_measured_s, subset_predicted_s):
    """Return the capacity estimate of a subset from its sample's measured service times.

    The sample's service times fit scale x t^_e2e + overhead (:func:`fit_service`); the
    subset's mean service time is that fit's mean over all its goals; capacity = 1 / that,
    goals per second. ``ratio``: sum(measured) / sum(predicted) over the sample.
    """
    scale, overhead = fit_service(sample_predicted_s, sample_measured_s)
    service_s = scale * statistics.mean(subset_predicted_s) + overhead
    return {'sample': len(sample_measured_s),
            'sample_measured_mean_s': statistics.mean(sample_measured_s),
            'sample_predicted_mean_s': statistics.mean(sample_predicted_s),
            'ratio': sum(sample_measured_s) / sum(sample_predicted_s),
            'scale': scale, 'overhead_s': overhead,
            'predicted_mean_s': statistics.mean(subset_predicted_s),
            'service_mean_s': service_s, 'capacity_per_s': 1.0 / service_s}


def budget_bases(predicted_s, capacity, basis='model'):
    """Return each goal's time the slack factor multiplies, seconds.

    basis ``model``: t^_e2e of the calibration (the goal's time model estimate); ``service``:
    the capacity fit's estimate of its service time through the server, scale x t^ + overhead.
    """
    if basis == 'model':
        return list(predicted_s)
    if basis == 'service':
        return [capacity['scale'] * t + capacity['overhead_s'] for t in predicted_s]
    raise ValueError(f'basis must be model or service, got {basis!r}')


def measure_capacity(client, items, predicted, k, n_max, progress):
    """Run a capacity sample of ``items`` one at a time on ``client``'s idle server.

    Returns :func:`estimate_capacity`'s dict with the sample's prompt ids and measured times.
    """
    from timebill_ros.ros.client import make_goal
    from timebill_ros.ros.conversions import duration_to_s
    sample = capacity_sample(predicted, k)
    measured = []
    for i in sample:
        result, _ = client.run(make_goal(items[i].prompt, budget_s=CAPACITY_BUDGET_S,
                                         max_new_tokens=n_max, policy=POLICY_KILL))
        measured.append(duration_to_s(result.total_time))
        progress(f'  capacity sample {items[i].prompt_id:16s} N_x={items[i].n_prompt_tokens:5d}'
                 f' N={items[i].n_tokens:4d} predicted {predicted[i]:6.2f} s, measured '
                 f'{measured[-1]:6.2f} s ({result.response_tokens} tokens, '
                 f'status {result.status})')
    capacity = estimate_capacity([predicted[i] for i in sample], measured, predicted)
    capacity['sample_ids'] = [items[i].prompt_id for i in sample]
    capacity['sample_measured_s'] = measured
    return capacity


def calibration_fit_pct(calibration):
    """Return the larger held-out MAPE of a calibration's two phases, percent (None: none)."""
    values = [v for v in (calibration.prefill_mape_pct, calibration.decode_mape_pct)
              if v is not None]
    return max(values) if values else None


def calibrate(path, n_max, progress, batches=False):
    """Return the calibration all budgets and servers use: ``path``'s, else a fresh one.

    A fresh one is profiled (start-up grid) in the machine state of the runs; when its
    held-out fit error exceeds CALIBRATION_MAPE_PCT (a busy machine), it is profiled once more
    and the better of the two kept. batches: also probe the batched step (consolidating
    servers budget with it; probed here once, not by each server while the others start).
    """
    from timebill_ros.timing.model import Calibration
    if path:
        progress(f'calibration: {path}')
        return Calibration.load(path)
    from timebill_ros.config import EngineConfig, ServerConfig
    from timebill_ros.engine import LlmEngine
    from timebill_ros.timing.profiler import profile, startup_grid
    config = ServerConfig(engine=EngineConfig(max_new_tokens=n_max))
    engine = LlmEngine.load(config.engine, config.eviction)
    best = None
    for attempt in range(2):
        calibration = profile(engine, startup_grid(engine.context_tokens), progress=progress)
        error = calibration_fit_pct(calibration)
        if best is None or (error is not None and error < calibration_fit_pct(best)):
            best = calibration
        if error is None or error <= CALIBRATION_MAPE_PCT:
            break
        progress(f'calibration: held-out MAPE {error:.0f} % > {CALIBRATION_MAPE_PCT:.0f} % '
                 '(is the machine busy?); profiling once more')
    if batches and not best.batch_points:
        import dataclasses
        from timebill_ros.timing.batch import probe_batches
        best = dataclasses.replace(best, batch_points=tuple(probe_batches(engine,
                                                                          progress=progress)))
    return best
