"""The scheduling benchmark's figures: one trace's goal rows to its metrics, and their summary."""

import statistics

import numpy as np

from timebill_ros.bench.scheduling.methods import METHODS
from timebill_ros.bench.scheduling.workload import SUBSETS
from timebill_ros.server.status import COMPLETED

NO_RESULT = 0  # status of a row whose goal was not accepted or got no result


def _met(row):
    return row['status'] == COMPLETED and bool(row['deadline_met'])


def _ran(row):
    return row['queue_s'] > 0 or row['prefill_s'] > 0 or row['status'] == COMPLETED


def _stats(values):
    if not values:
        return None, None, None
    return (float(np.mean(values)), float(np.percentile(values, 95)), float(max(values)))


def cell_metrics(rows):
    """Return the metrics of one (subset, load, repeat, method) trace from its goal rows.

    A goal misses unless COMPLETED with deadline_met. Response time = total_time (receipt to
    result), over completed goals (``_done``) and over all goals with a result (``_all``).
    Throughput: completed goals per minute over the makespan (first send to last result).
    Queue wait: mean queue_time of the goals that started running. Scheduler overhead: mean
    ``schedule_s`` where the result carried one (None otherwise), and its sum as a share of
    those goals' summed total_time, in percent. u_J predict: mean predict time of the goals
    whose length was predicted at admission (the prediction their run reused; runs from
    before the split of schedule_time counted it in ``schedule_s``). offloaded: the share of
    goals that ran on the ``offload`` executor (None when no result names an executor).
    batched: the share of the goals that ran in a batch of two or more (None when no
    result carries a batch size).
    Short goals: N below the subset's median (``short`` in the rows).
    """
    if not rows:
        raise ValueError('no rows')
    n = len(rows)
    done = [r for r in rows if r['status'] == COMPLETED]
    answered = [r for r in rows if r['status'] != NO_RESULT]
    short = [r for r in rows if r['short']]
    ran = [r for r in rows if _ran(r)]
    ends = [r['sent_s'] + r['total_s'] for r in answered]
    makespan = max(ends, default=0.0) - min(r['sent_s'] for r in rows)
    overheads = [r for r in rows if r.get('schedule_s') is not None]
    early = [r['predict_s'] for r in rows if r.get('at_admission')]
    overhead_total = sum(r['total_s'] for r in overheads)
    executors = [r.get('executor') or '' for r in ran]
    out = {'goals': n, 'met': sum(map(_met, rows)), 'completed': len(done),
           'miss_rate': 1.0 - sum(map(_met, rows)) / n,
           'miss_rate_short': (1.0 - sum(map(_met, short)) / len(short)) if short else None,
           'short_goals': len(short), 'completion_rate': len(done) / n,
           'makespan_s': makespan,
           'throughput_per_min': 60.0 * len(done) / makespan if makespan > 0 else None,
           'queue_wait_mean': statistics.mean(r['queue_s'] for r in ran) if ran else None,
           'sched_overhead_ms': (1e3 * statistics.mean(r['schedule_s'] for r in overheads)
                                 if overheads else None),
           'sched_overhead_pct': (100.0 * sum(r['schedule_s'] for r in overheads)
                                  / overhead_total if overhead_total > 0 else None),
           'admission_predict_ms': 1e3 * statistics.mean(early) if early else None,
           'offloaded': (sum(e == 'offload' for e in executors) / len(executors)
                         if any(executors) else None),
           'batched': (sum(r.get('batch_size', 0) > 1 for r in ran) / len(ran)
                       if any(r.get('batch_size') for r in ran) else None),
           'no_result': n - len(answered)}
    for suffix, group in (('done', done), ('all', answered)):
        mean, p95, peak = _stats([r['total_s'] for r in group])
        out.update({f'resp_mean_{suffix}': mean, f'resp_p95_{suffix}': p95,
                    f'resp_max_{suffix}': peak})
    return out


def _spread(values):
    """Return (mean, sample sd or None) of the non-None values; (None, None) if none."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return float(np.mean(values)), (float(np.std(values, ddof=1)) if len(values) > 1 else None)


def summarize(rows):
    """Return one dict per (subset, load, method): each metric's (mean, sd) over the repeats.

    Keys: subset, load, method, repeats, and per metric of :func:`cell_metrics` a pair.
    Sorted by subset (SUBSETS order), load, then method (METHODS order).
    """
    cells = {}
    for row in rows:
        key = (row['subset'], row['load'], row['method'], row['repeat'])
        cells.setdefault(key, []).append(row)
    per_cell = {key: cell_metrics(items) for key, items in cells.items()}
    groups = {}
    for (subset, load, method, _), metrics in per_cell.items():
        groups.setdefault((subset, load, method), []).append(metrics)
    method_rank = {m[0]: i for i, m in enumerate(METHODS)}
    table = []
    for (subset, load, method), repeats in sorted(
            groups.items(), key=lambda kv: (SUBSETS.index(kv[0][0]) if kv[0][0] in SUBSETS
                                            else len(SUBSETS), kv[0][1],
                                            method_rank.get(kv[0][2], len(METHODS)),
                                            kv[0][2])):
        entry = {'subset': subset, 'load': load, 'method': method, 'repeats': len(repeats)}
        for key in repeats[0]:
            entry[key] = _spread([m[key] for m in repeats])
        table.append(entry)
    return table
