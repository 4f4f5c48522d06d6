"""``timebill schedbench``: scheduling policies under Poisson load, through the real node.

After RT-LM Sec. V, adapted to one CPU and to deadlines:

- Workload subsets: held-out prompts of the length predictor's corpus (test split; val joins
  when test is too small) with the target model's measured response length N
  (``data/rlp/lengths.jsonl``; greedy, capped at n_model = 128), in three subsets of small,
  medium ("normal") and large variance of N (RT-LM Table III): ``small`` = the goals whose N
  lies closest to the pool's median, ``medium`` = one goal from each of ``goals`` equal rank
  strata of the pool (the pool's own distribution), ``large`` = the shortest half and the
  longest half. Prompts longer than ``--max-prompt-tokens`` are left out of the pool, so that
  the subsets' service times vary through N rather than through a few very long prefills.
- Capacity of each subset: a sample of its goals (evenly spread over their predicted service
  times) runs one at a time on an idle server; capacity = 1 / mean service time, where the
  subset's mean comes from the time model over all its goals, fitted to the sample's measured
  times (scale x t^_e2e + overhead): a small sample's own mean would hang on which goals it
  drew.
- Arrivals: Poisson at ``load x capacity`` goals/s. Each goal's deadline is a time budget
  t^_e2e x s with t^_e2e = prefill(N_x) + N decoding steps from the calibration taken at the
  start, and s uniform in ``--slack``; overrun policy Kill (``--overrun skip_next``: a
  running goal finishes late, queued goals that come due meanwhile are SKIPPED), N_max = 128.
  With ``--budget-basis service`` the factor multiplies the goal's service time through the server
  instead (the capacity sample's fit scale x t^_e2e + overhead: the time model leaves out
  what a goal costs beyond prefill and decoding, which short goals feel most). For one subset and
  repeat, every load uses the same goal order, slack factors and unit exponential gaps, the
  gaps divided by the rate (common random numbers: the loads differ only in load).
- Methods: one server process per method (``METHODS``), all started at once and sharing the
  calibration; each (subset, load, repeat) trace is played against every method in turn,
  the order rotated from cell to cell, so drift of the machine's speed hits all alike.
  Goals are sent at their arrival times without waiting; results are collected after the
  trace, and every result is in before the next method starts.
"""

import contextlib
import datetime
import json
import math
import pathlib
import shlex
import statistics
import sys
import tempfile
import time

import numpy as np

# (name, server parameters). A method whose parameters config_from_flat refuses is skipped.
METHODS = (('fifo', {'scheduler.policy': 'fifo'}),
           ('edf', {'scheduler.policy': 'edf'}),
           ('luf', {'scheduler.policy': 'luf'}),
           ('muf', {'scheduler.policy': 'muf'}),
           ('slack', {'scheduler.policy': 'slack'}),
           ('up', {'scheduler.policy': 'up'}),
           # Control for up+offload: one executor with the thread count each of those has.
           ('up-1thread', {'scheduler.policy': 'up', 'engine.threads': 1}),
           # Both executors on this CPU: the primary gets 1 thread, the offload engine 1.
           ('up+offload', {'scheduler.policy': 'up', 'offload.enabled': True,
                           'engine.threads': 1, 'offload.threads': 1}),
           # Consolidation (Sec. IV-C): similar-length goals decode as one batch.
           ('up+consolidation', {'scheduler.policy': 'up', 'scheduler.consolidation': True}),
           # RT-LM as a whole: up + consolidation + offload (1 + 1 threads as above).
           ('rt-lm', {'scheduler.policy': 'up', 'scheduler.consolidation': True,
                      'offload.enabled': True, 'engine.threads': 1, 'offload.threads': 1}),
           # Batching without priorities: the receipt-order goal plus whoever is similar.
           ('fifo+consolidation', {'scheduler.policy': 'fifo',
                                   'scheduler.consolidation': True}),
           # The strong baseline a vLLM or llama.cpp user expects: receipt order, and waiting
           # goals join the decoding batch between steps.
           ('fifo+continuous', {'scheduler.policy': 'fifo', 'scheduler.continuous': True}))
# Run instead when a method's own parameters are refused: a server without scheduler.policy
# runs its goals in order of receipt.
FALLBACK_PARAMS = {'fifo': {}}
SUBSETS = ('small', 'medium', 'large')
LOADS = (0.5, 0.8, 1.0, 1.2)
SLACK = (1.5, 4.0)
GOALS = 24
REPEATS = 2
QUICK = {'subsets': ('large',), 'loads': (0.8, 1.2), 'goals': 12, 'repeats': 1,
         'methods': ('fifo', 'up')}
N_MAX = 128
MAX_PROMPT_TOKENS = 1024
CAPACITY_SAMPLE = 6
CAPACITY_BUDGET_S = 600.0
CALIBRATION_MAPE_PCT = 25.0  # a fit worse than this (held out) is profiled again / flagged
RESULT_GRACE_S = 120.0  # beyond the longest budget of a trace, seconds
POLICY_KILL = 1
COMPLETED = 1
NO_RESULT = 0  # status of a row whose goal was not accepted or got no result
DEFAULT_LENGTHS = 'data/rlp/lengths.jsonl'
# (key, column header, format) of the per-subset tables.
METRICS = (('miss_rate', 'miss rate', '{:.2f}'),
           ('miss_rate_short', 'miss rate short', '{:.2f}'),
           ('completion_rate', 'completed', '{:.2f}'),
           ('resp_mean_done', 'resp mean (done) s', '{:.2f}'),
           ('resp_p95_done', 'resp p95 (done) s', '{:.2f}'),
           ('resp_max_done', 'resp max (done) s', '{:.2f}'),
           ('resp_mean_all', 'resp mean (all) s', '{:.2f}'),
           ('resp_p95_all', 'resp p95 (all) s', '{:.2f}'),
           ('resp_max_all', 'resp max (all) s', '{:.2f}'),
           ('throughput_per_min', 'done / min', '{:.1f}'),
           ('queue_wait_mean', 'queue wait (ran) s', '{:.2f}'),
           ('sched_overhead_ms', 'sched overhead ms', '{:.3f}'),
           ('sched_overhead_pct', 'sched overhead % of e2e', '{:.4f}'),
           ('admission_predict_ms', 'u_J predict ms', '{:.0f}'),
           ('offloaded', 'offloaded', '{:.2f}'),
           ('batched', 'batched', '{:.2f}'))


# --- workload (pure) -------------------------------------------------------------------------
def load_pool(lengths_path=DEFAULT_LENGTHS, goals=GOALS, max_prompt_tokens=MAX_PROMPT_TOKENS,
              examples=None, split='test'):
    """Return the held-out prompts the subsets are drawn from (rlp.dataset.Example list).

    split ``test``: the test split, joined by the val split when test has fewer than
    ``2 * goals`` prompts of at most ``max_prompt_tokens`` chat-formatted tokens (0 = no
    limit). split ``val``: the val split alone (to tune on prompts the evaluation does not
    use). ``examples``: a ``{split: [Example]}`` to use instead of reading ``lengths_path``.
    """
    if split not in ('test', 'val'):
        raise ValueError(f'split must be test or val, got {split!r}')
    if examples is None:
        from timebill_ros.training.dataset import load_examples
        examples = load_examples(lengths_path)

    def fits(example):
        return not max_prompt_tokens or example.n_prompt_tokens <= max_prompt_tokens

    pool = [e for e in examples.get(split, []) if fits(e)]
    if split == 'test' and len(pool) < 2 * goals:
        pool += [e for e in examples.get('val', []) if fits(e)]
    if len(pool) < goals:
        raise ValueError(f'only {len(pool)} held-out prompts of at most {max_prompt_tokens} '
                         f'tokens; {goals} goals a subset need more')
    return pool


def make_subsets(pool, goals=GOALS, seed=0, names=SUBSETS):
    """Return {name: [Example]}: ``goals`` prompts of small / medium / large length variance.

    small: the prompts whose response length N lies closest to the pool's median N.
    medium: one prompt drawn from each of ``goals`` equal strata of the pool sorted by N (the
    pool's own distribution of N: RT-LM's "normal" variance).
    large: the ``goals // 2`` shortest and the rest from the longest.
    Ties of N are broken by a permutation drawn from ``seed``, so a seed picks different
    prompts of the same lengths. Each subset is listed by increasing N.
    """
    if len(pool) < goals:
        raise ValueError(f'the pool has {len(pool)} prompts, fewer than {goals} goals')
    unknown = sorted(set(names) - set(SUBSETS))
    if unknown:
        raise ValueError(f'unknown subset(s) {unknown}; known: {list(SUBSETS)}')
    rng = np.random.default_rng(seed)
    tie = dict(zip((e.prompt_id for e in pool), rng.permutation(len(pool)).tolist()))
    ranked = sorted(pool, key=lambda e: (e.n_tokens, tie[e.prompt_id]))
    median = float(np.median([e.n_tokens for e in pool]))
    out = {}
    if 'small' in names:
        out['small'] = sorted(pool, key=lambda e: (abs(e.n_tokens - median),
                                                   tie[e.prompt_id]))[:goals]
    if 'medium' in names:
        bounds = np.linspace(0, len(ranked), goals + 1)
        picks = [int(rng.integers(math.ceil(lo), max(math.ceil(lo) + 1, math.ceil(hi))))
                 for lo, hi in zip(bounds[:-1], bounds[1:])]
        out['medium'] = [ranked[i] for i in picks]
    if 'large' in names:
        out['large'] = ranked[:goals // 2] + ranked[len(ranked) - (goals - goals // 2):]
    return {name: sorted(out[name], key=lambda e: (e.n_tokens, tie[e.prompt_id]))
            for name in names}


def subset_stats(items):
    """Return the response-length (N) and prompt-length (N_x) figures of a subset, tokens."""
    lengths = [e.n_tokens for e in items]
    prompts = [e.n_prompt_tokens for e in items]
    median = float(np.median(lengths))
    return {'goals': len(items), 'mean': float(np.mean(lengths)),
            'std': float(np.std(lengths)), 'min': min(lengths), 'max': max(lengths),
            'median': median, 'capped': sum(bool(e.capped) for e in items),
            'short': sum(n < median for n in lengths),
            'prompt_mean': float(np.mean(prompts)), 'prompt_max': max(prompts)}


def predicted_service_s(coefficients, n_x, n_tokens, n_max=N_MAX):
    """Return t^_e2e, seconds: prefill of N_x tokens and min(N, N_max) tokens decoded."""
    return coefficients.prefill_s(n_x) + coefficients.decode_phase_s(
        n_x, 0.0, min(n_tokens, n_max))


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


def make_trace(items, base_s, rate_per_s, slack=SLACK, seed=0):
    """Return the goals of one trace in order of arrival: [{index, arrival_s, slack, budget_s}].

    Poisson arrivals at ``rate_per_s`` goals per second (the first at 0); budget = the goal's
    ``base_s`` (t^_e2e, :func:`budget_bases`) x a slack factor uniform in ``slack``. The
    goal order, the factors and the unit exponential gaps come from ``seed`` alone, so the
    same seed at another rate gives the same goals with arrival times scaled by the ratio of
    the rates.
    """
    if rate_per_s <= 0:
        raise ValueError(f'rate_per_s must be > 0, got {rate_per_s!r}')
    low, high = slack
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(items))
    gaps = rng.exponential(1.0, len(items))
    factors = rng.uniform(low, high, len(items))
    arrivals = (np.cumsum(gaps) - gaps[0]) / rate_per_s
    return [{'index': int(i), 'arrival_s': float(t), 'slack': float(f),
             'budget_s': round(float(f) * base_s[i], 3)}
            for i, t, f in zip(order, arrivals, factors)]


def trace_seed(seed, subset, repeat):
    """Return the numpy seed of the traces of (subset, repeat): independent of the load."""
    return [int(seed), SUBSETS.index(subset), int(repeat)]


def rotate(items, turn):
    """Return ``items`` rotated left by ``turn`` (mod its length)."""
    items = list(items)
    if not items:
        return items
    k = turn % len(items)
    return items[k:] + items[:k]


def selected_methods(names=None):
    """Return the METHODS entries named in ``names`` (iterable or comma string; all if empty).

    ``up@ALPHA`` (ALPHA a number >= 0) is ``up`` with ``scheduler.up_alpha`` ALPHA, for
    sweeping Eq. 3's alpha (RT-LM Fig. 13a); these follow the named METHODS, in given order.
    """
    if not names:
        return list(METHODS)
    if isinstance(names, str):
        names = [n.strip() for n in names.split(',') if n.strip()]
    known = [m[0] for m in METHODS]
    sweeps = [n for n in names if n.startswith('up@')]
    unknown = sorted(set(names) - set(known) - set(sweeps))
    if unknown:
        raise ValueError(f'unknown method(s) {unknown}; known: {known} and up@ALPHA')
    return [m for m in METHODS if m[0] in names] + [_alpha_method(n) for n in sweeps]


def _alpha_method(name):
    """Return the METHODS-style entry of ``up@ALPHA``; ALPHA is checked as the server checks it."""
    from timebill_ros.config import SchedulerConfig
    try:
        alpha = float(name[len('up@'):])
        SchedulerConfig(policy='up', up_alpha=alpha)
    except ValueError as exc:
        raise ValueError(f'{name!r}: ALPHA of up@ALPHA must be a finite number >= 0 '
                         f'({exc})') from None
    return name, {'scheduler.policy': 'up', 'scheduler.up_alpha': alpha}


def method_params(name, flat, check=None):
    """Return (server parameters, note) of a method, or (None, why) when they are refused.

    check(flat) raises ValueError / TypeError on parameters the server does not know
    (default: params.config_from_flat). A refused ``fifo`` falls back to FALLBACK_PARAMS.
    """
    if check is None:
        from timebill_ros.params import config_from_flat as check
    try:
        check(flat)
        return flat, ''
    except (ValueError, TypeError) as exc:
        why = str(exc)
    fallback = FALLBACK_PARAMS.get(name)
    if fallback is not None:
        try:
            check(fallback)
            return fallback, f'{why}; ran the server default (order of receipt) instead'
        except (ValueError, TypeError):
            pass
    return None, why


# --- metrics (pure) --------------------------------------------------------------------------
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


# --- report (pure) ---------------------------------------------------------------------------
def _fmt(pair, fmt):
    mean, sd = pair
    if mean is None:
        return ''
    return fmt.format(mean) + ('' if sd is None else ' ± ' + fmt.format(sd))


_OVERRUN_TEXT = {'kill': 'Kill',
                 'skip_next': 'Skip-Next (a running goal finishes late; queued goals that '
                              'come due meanwhile are SKIPPED)'}
_BASIS_TEXT = {'model': 't^_e2e (calibration)',
               'service': 'the service fit (scale x t^_e2e + overhead)'}


def report(data):
    """Return the markdown report of a run (the dict saved as ``schedbench_raw.json``)."""
    meta = data['meta']
    table = summarize(data['rows'])
    lines = ['# Scheduling benchmark (RT-LM Sec. V, adapted)', '',
             f'Command: `{meta["command"]}`', '',
             f'Run {meta.get("started", "?")}, {meta.get("runtime_s", 0) / 60:.1f} min; '
             f'seed {meta["seed"]}; {meta["repeats"]} repeat(s) a cell (values: mean ± sample '
             f'sd over repeats); overrun policy {_OVERRUN_TEXT[meta.get("overrun", "kill")]}; '
             'N_max '
             f'{meta["n_max"]}; budget = {_BASIS_TEXT[meta.get("budget_basis", "model")]} '
             f'x slack, slack uniform in [{meta["slack"][0]}, {meta["slack"][1]}]; Poisson '
             'arrivals at load x capacity.',
             '', 'A goal misses unless COMPLETED with deadline_met. Response time = receipt '
             'to result (total_time): "done" over completed goals, "all" over every goal. '
             '"short": goals whose measured response length is below their subset\'s median. '
             'Throughput: completed goals per minute over the makespan (first send to last '
             'result). Queue wait: goals that started running. Sched overhead: the '
             'scheduler\'s choices (schedule_time), mean ms a goal and as % of the summed '
             'response times; u_J predict: the length prediction at admission that the run '
             'reused (not an overhead: each goal is predicted once either way). offloaded: '
             'share of the goals that ran on the offload executor. batched: share of the goals '
             'that ran in a decoding batch of two or more (scheduler.consolidation).', '']
    ran = ', '.join(meta['methods']) or 'none'
    lines.append(f'Methods run: {ran}.')
    for name, why in meta.get('skipped', {}).items():
        lines.append(f'Skipped {name}: {why}')
    for name, note in meta.get('notes', {}).items():
        lines.append(f'Note on {name}: {note}')
    lines += ['', f'## Workload subsets ({meta["pool"]})', '',
              '| subset | goals | N mean | N sd | N min-max | capped | short | N_x mean (max) '
              '| t^_e2e mean s | sample measured s | measured / t^ | service fit '
              '| capacity goals/s |', '|' + '---|' * 13]
    for name, sub in meta['subsets'].items():
        st, cap = sub['stats'], sub.get('capacity')
        measured = (f'{cap["sample_measured_mean_s"]:.2f} | {cap["ratio"]:.2f} | '
                    f'{cap["scale"]:.2f} t^ + {cap["overhead_s"]:.2f} s | '
                    f'{cap["capacity_per_s"]:.3f}') if cap else ' | | | '
        lines.append(
            f'| {name} | {st["goals"]} | {st["mean"]:.1f} | {st["std"]:.1f} | '
            f'{st["min"]}-{st["max"]} | {st["capped"]} | {st["short"]} | '
            f'{st["prompt_mean"]:.0f} ({st["prompt_max"]}) | '
            f'{sub["predicted_mean_s"]:.2f} | {measured} |')
    lines += ['', 'Capacity = 1 / the mean over the subset of its service fit (measured = '
              'scale x t^_e2e + overhead, least squares over the sample; overhead 0 when the '
              f'sample\'s t^ are too alike): the sample ({meta["capacity_sample"]} goals spread '
              'over the subset\'s predicted times) ran one at a time with a '
              f'{CAPACITY_BUDGET_S:.0f} s budget on the {meta.get("capacity_method", "?")} '
              'server.']
    for subset in meta['subsets']:
        entries = [e for e in table if e['subset'] == subset]
        if not entries:
            continue
        lines += ['', f'## Subset {subset}', '',
                  '| load | method | ' + ' | '.join(h for _, h, _ in METRICS) + ' |',
                  '|' + '---|' * (len(METRICS) + 2)]
        for e in entries:
            lines.append(f'| {e["load"]:.2f} | {e["method"]} | '
                         + ' | '.join(_fmt(e[k], f) for k, _, f in METRICS) + ' |')
        missing = sum(e['no_result'][0] or 0 for e in entries)
        if missing:
            lines.append(f'\n{missing:.0f} goal(s) a repeat on average got no result '
                         '(not accepted or timed out); they count as misses.')
    if meta.get('send_lag_max_s') is not None:
        lines += ['', f'Largest lag of a goal\'s send behind its arrival time: '
                  f'{meta["send_lag_max_s"] * 1e3:.0f} ms.']
    fit = meta.get('calibration_fit_pct')
    if fit is not None and fit > CALIBRATION_MAPE_PCT:
        lines += ['', f'**Warning:** the calibration\'s held-out MAPE is {fit:.0f} % (> '
                  f'{CALIBRATION_MAPE_PCT:.0f} %): the machine was busy while profiling, '
                  'the time model is off by the measured / t^ ratio above.']
    lines += ['', 'Time model (ETE) fit, shared by all servers:', '```',
              meta.get('calibration_report', ''), '```']
    return '\n'.join(lines) + '\n'


def plot(data, path):
    """Write miss rate (top) and throughput (bottom) vs load: a column per subset, a line a method.

    Error bars are the sample sd over repeats; throughput is completed goals per minute.
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    table = summarize(data['rows'])
    subsets = [s for s in data['meta']['subsets'] if any(e['subset'] == s for e in table)]
    fig, axes = plt.subplots(2, max(1, len(subsets)), figsize=(5 * max(1, len(subsets)), 7),
                             squeeze=False, sharex=True)
    for column, subset in enumerate(subsets):
        methods = []
        for e in table:
            if e['subset'] == subset and e['method'] not in methods:
                methods.append(e['method'])
        for row, key in enumerate(('miss_rate', 'throughput_per_min')):
            axis = axes[row][column]
            for method in methods:
                pts = [(e['load'], *e[key]) for e in table
                       if e['subset'] == subset and e['method'] == method
                       and e[key][0] is not None]
                axis.errorbar([p[0] for p in pts], [p[1] for p in pts],
                              yerr=[p[2] or 0.0 for p in pts], marker='o', capsize=3,
                              label=method)
        axes[0][column].set(title=f'{subset} variance', ylim=(-0.02, 1.02))
        axes[1][column].set(xlabel='offered load (x capacity)')
        axes[0][column].legend(fontsize=8)
    axes[0][0].set_ylabel('deadline-miss rate')
    axes[1][0].set_ylabel('completed goals / min')
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_outputs(data, out_dir, progress=print):
    """Write schedbench_raw.json, schedbench.md, schedbench.png and calibration.txt."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / 'schedbench_raw.json').write_text(json.dumps(data, indent=1))
    text = report(data)
    (out_dir / 'schedbench.md').write_text(text)
    (out_dir / 'calibration.txt').write_text(data['meta'].get('calibration_report', '') + '\n')
    if data['rows']:
        plot(data, out_dir / 'schedbench.png')
    progress(text)
    return text


# --- running (needs the model and ROS 2) -----------------------------------------------------
def _server_params(name, flat, folder, n_max, queue_depth):
    from timebill_ros import params
    from timebill_ros.bench.timebill import decode_weights_of
    calibration_file = str(pathlib.Path(folder) / 'calibration.yaml')
    base = {'engine.max_new_tokens': n_max,
            'timing.calibration_file': calibration_file,
            'engine.decode_weights': decode_weights_of(calibration_file),
            # Each server keeps its own online state: methods must not learn from each other.
            'timing.state_file': str(pathlib.Path(folder) / f'{_safe(name)}.online.yaml'),
            # Room for a whole trace: no goal is refused for queue depth.
            'queue.max_depth': queue_depth}
    config = params.config_from_flat({**base, **flat})
    path = pathlib.Path(folder) / f'{_safe(name)}.yaml'
    path.write_text(params.to_yaml(config))
    return str(path)


def _safe(name):
    return ''.join(c if c.isalnum() or c in '-_' else '_' for c in name)


def _row(result, goal, info):
    from timebill_ros.ros.conversions import duration_to_s
    from timebill_ros.server.status import STATUS_NAMES
    row = dict(info)
    if result is None:
        row.update({'status': NO_RESULT, 'status_name': 'NO_RESULT', 'deadline_met': False,
                    'total_s': 0.0, 'queue_s': 0.0, 'prefill_s': 0.0, 'decode_s': 0.0,
                    'response_tokens': 0, 'predicted_tokens': 0, 'uncertainty_tokens': 0,
                    'eviction_ratio': 0.0, 'executor': '', 'schedule_s': None, 'batch_size': 0,
                    'predict_s': 0.0, 'at_admission': False, 'infeasible': False})
        return row
    schedule = getattr(result, 'schedule_time', None)
    row.update({'status': int(result.status),
                'status_name': STATUS_NAMES.get(result.status, str(result.status)),
                'deadline_met': bool(result.deadline_met),
                'total_s': duration_to_s(result.total_time),
                'queue_s': duration_to_s(result.queue_time),
                'prefill_s': duration_to_s(result.prefill_time),
                'decode_s': duration_to_s(result.decode_time),
                'response_tokens': int(result.response_tokens),
                'predicted_tokens': int(result.predicted_tokens),
                'uncertainty_tokens': int(getattr(result, 'uncertainty_tokens', 0)),
                'eviction_ratio': float(result.eviction_ratio),
                'executor': str(getattr(result, 'executor', '')),
                'batch_size': int(getattr(result, 'batch_size', 0)),
                'schedule_s': None if schedule is None else duration_to_s(schedule),
                'predict_s': duration_to_s(result.predict_time),
                'at_admission': str(result.predictor).endswith('(at admission)'),
                'infeasible': bool(result.infeasible), 'message': result.message})
    return row


def play_trace(client, goals, n_max=N_MAX, policy=POLICY_KILL):
    """Send ``goals`` ([{prompt, arrival_s, budget_s}]) at their arrival times; wait for all.

    Returns [(sent_s, Instruct.Result or None, note)] in the order of ``goals``; sent_s is
    the send time relative to the trace's start. Under Kill a result comes by the longest
    budget; under Skip-Next a running goal finishes late, so a result may take up to the sum
    of the budgets.
    """
    from timebill_ros.ros.client import make_goal
    handles = []
    start = time.monotonic()
    for goal in goals:
        time.sleep(max(0.0, start + goal['arrival_s'] - time.monotonic()))
        sent_s = time.monotonic() - start
        handles.append((sent_s, client.send(make_goal(
            goal['prompt'], budget_s=goal['budget_s'], max_new_tokens=n_max, policy=policy))))
    timeout_s = max(g['budget_s'] for g in goals) + RESULT_GRACE_S
    if policy != POLICY_KILL:
        timeout_s += sum(g['budget_s'] for g in goals)
    out = []
    for sent_s, handle in handles:
        if handle is None or not handle.accepted:
            out.append((sent_s, None, 'not accepted'))
            continue
        try:
            result, _ = client.result(handle, timeout_s=timeout_s)
        except TimeoutError as exc:
            out.append((sent_s, None, str(exc)))
            continue
        out.append((sent_s, result, ''))
    return out


def _measure_capacity(client, items, predicted, k, n_max, progress):
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


def _calibration(path, n_max, progress, batches=False):
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


def _resolve(args):
    """Return the run's settings: explicit options, else --quick's, else the defaults."""
    quick = bool(getattr(args, 'quick', False))

    def pick(value, name, default):
        if value not in (None, ''):
            return value
        return QUICK[name] if quick else default

    def floats(text):
        return tuple(float(x) for x in text.split(',')) if isinstance(text, str) else text

    subsets = pick(args.subsets, 'subsets', SUBSETS)
    subsets = tuple(s.strip() for s in subsets.split(',')) if isinstance(subsets, str) \
        else tuple(subsets)
    slack = floats(args.slack) if args.slack else SLACK
    if len(slack) != 2 or not 0 < slack[0] <= slack[1]:
        raise ValueError(f'--slack needs two factors 0 < low <= high, got {args.slack!r}')
    return {'subsets': tuple(s for s in SUBSETS if s in subsets),
            'loads': floats(pick(args.loads, 'loads', LOADS)),
            'goals': int(pick(args.goals, 'goals', GOALS)),
            'repeats': int(pick(args.repeats, 'repeats', REPEATS)),
            'methods': selected_methods(pick(args.methods, 'methods', ())),
            'slack': slack}


def missing_predictor(config=None):
    """Return why the servers would run without the RLP (text), or None when it is there."""
    from timebill_ros import params
    from timebill_ros.engine import model_source
    from timebill_ros.predictors.contract import default_onnx_path
    config = config or params.config_from_flat({})
    if config.predictor.kind != 'rlp':
        return None
    path = pathlib.Path(config.predictor.model_file or default_onnx_path(
        model_source.model_key(config.engine), config.engine.model_cache_dir or None))
    if path.expanduser().is_file():
        return None
    return f'no RLP at {path} (make predictor builds it)'


def run_schedbench(args, progress=print, argv=None):
    """Run the benchmark; write its outputs under ``args.out``.

    With ``args.from_json`` only re-make the md, png and calibration report of a saved run.
    """
    out_dir = pathlib.Path(args.out)
    if args.from_json:
        data = json.loads(pathlib.Path(args.from_json).read_text())
        write_outputs(data, out_dir, progress)
        return 0
    argv = sys.argv[1:] if argv is None else argv
    started = time.monotonic()
    settings = _resolve(args)
    n_max = args.n_max
    pool = load_pool(args.lengths, settings['goals'], args.max_prompt_tokens,
                     split=getattr(args, 'pool', 'test'))
    subsets = make_subsets(pool, settings['goals'], args.seed, settings['subsets'])
    runnable, skipped, notes = [], {}, {}
    for name, flat in settings['methods']:
        server_flat, note = method_params(name, flat)
        if server_flat is None:
            progress(f'method {name} skipped: the server refuses its parameters {flat}: {note}')
            skipped[name] = f'parameters {flat} refused: {note}'
            continue
        if note:
            progress(f'method {name}: {note}')
            notes[name] = note
        runnable.append((name, server_flat))
        if server_flat.get('offload.enabled'):
            notes[name] = ('a second executor (offload.device / offload.threads) that also '
                           'takes the other executor\'s goals while that one is busy: more '
                           'capacity than the single-executor capacity the loads refer to.')
    if not runnable:
        progress('no method can run')
        return 1
    missing = missing_predictor()
    if missing and not getattr(args, 'allow_fallback', False):
        progress(f'{missing}; without it every u_J is N_max and the uncertainty-aware methods '
                 'have nothing to go on (--allow-fallback runs anyway)')
        return 2

    from timebill_ros.timing.profiler import format_report
    batches = any(flat.get('scheduler.consolidation') or flat.get('scheduler.continuous')
                  for _, flat in runnable)
    calibration = _calibration(args.calibration, n_max, progress, batches)
    out_dir.mkdir(parents=True, exist_ok=True)
    calibration.save(out_dir / 'calibration.yaml')  # for --calibration of a later run
    coefficients = calibration.coefficients
    predicted = {name: [predicted_service_s(coefficients, e.n_prompt_tokens, e.n_tokens, n_max)
                        for e in items] for name, items in subsets.items()}
    meta = {'command': 'timebill ' + shlex.join(argv),
            'started': datetime.datetime.now().isoformat(timespec='seconds'),
            'seed': args.seed, 'goals': settings['goals'], 'loads': list(settings['loads']),
            'repeats': settings['repeats'], 'slack': list(settings['slack']), 'n_max': n_max,
            'max_prompt_tokens': args.max_prompt_tokens, 'budget_basis': args.budget_basis,
            'overrun': getattr(args, 'overrun', 'kill'),
            'pool': f'{len(pool)} held-out prompts ('
                    + ', '.join(f'{s} {sum(e.split == s for e in pool)}'
                                for s in ('test', 'val') if any(e.split == s for e in pool))
                    + f'), N_x <= {args.max_prompt_tokens or "any"}',
            'methods': [m[0] for m in runnable], 'skipped': skipped, 'notes': notes,
            'capacity_sample': args.capacity_sample,
            'calibration_report': format_report(calibration),
            'calibration_fit_pct': calibration_fit_pct(calibration),
            'subsets': {name: {'stats': subset_stats(items),
                               'predicted_mean_s': statistics.mean(predicted[name]),
                               'prompt_ids': [e.prompt_id for e in items]}
                        for name, items in subsets.items()}}
    for name, sub in meta['subsets'].items():
        st = sub['stats']
        progress(f'subset {name}: N mean {st["mean"]:.1f} sd {st["std"]:.1f} '
                 f'({st["min"]}-{st["max"]}), t^_e2e mean {sub["predicted_mean_s"]:.2f} s')
    rows, lags = [], []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as servers:
        calibration.save(pathlib.Path(tmp) / 'calibration.yaml')
        from timebill_ros.cli.demo import served
        from timebill_ros.server.status import POLICY_CODES
        clients = []
        log_dir = out_dir / 'logs'
        log_dir.mkdir(parents=True, exist_ok=True)
        for index, (name, flat) in enumerate(runnable):
            progress(f'starting the server of method {name}')
            params_file = _server_params(name, flat, tmp, n_max,
                                         max(16, settings['goals']))
            clients.append((name, servers.enter_context(served(
                params_file, log_dir / f'{_safe(name)}.log',
                node_name=f'timebill_sched_{index}'))))
        capacity_name, capacity_client = next(
            ((n, c) for n, c in clients if n == 'fifo'), clients[0])
        meta['capacity_method'] = capacity_name
        turn = 0
        for subset, items in subsets.items():
            progress(f'capacity of subset {subset} (on the {capacity_name} server)')
            capacity = _measure_capacity(capacity_client, items, predicted[subset],
                                         args.capacity_sample, n_max, progress)
            meta['subsets'][subset]['capacity'] = capacity
            progress(f'  capacity {capacity["capacity_per_s"]:.3f} goals/s (service ~ '
                     f'{capacity["scale"]:.2f} t^_e2e + {capacity["overhead_s"]:.2f} s)')
            median = meta['subsets'][subset]['stats']['median']
            bases = budget_bases(predicted[subset], capacity, args.budget_basis)
            for repeat in range(settings['repeats']):
                for load in settings['loads']:
                    trace = make_trace(items, bases,
                                       load * capacity['capacity_per_s'], settings['slack'],
                                       trace_seed(args.seed, subset, repeat))
                    goals = [dict(g, prompt=items[g['index']].prompt) for g in trace]
                    for name, client in rotate(clients, turn):
                        progress(f'{subset} load {load:.2f} repeat {repeat} {name}: '
                                 f'{len(goals)} goals over {trace[-1]["arrival_s"]:.0f} s')
                        for goal, (sent_s, result, note) in zip(
                                goals, play_trace(client, goals, n_max,
                                                  POLICY_CODES[meta['overrun']])):
                            e = items[goal['index']]
                            lags.append(sent_s - goal['arrival_s'])
                            rows.append(_row(result, goal, {
                                'subset': subset, 'load': load, 'repeat': repeat,
                                'method': name, 'prompt_id': e.prompt_id,
                                'category': e.category, 'n_x': e.n_prompt_tokens,
                                'n_tokens': e.n_tokens, 'short': e.n_tokens < median,
                                'predicted_s': predicted[subset][goal['index']],
                                'slack': goal['slack'], 'budget_s': goal['budget_s'],
                                'arrival_s': goal['arrival_s'], 'sent_s': sent_s,
                                'message': note}))
                        m = cell_metrics(rows[-len(goals):])
                        progress(f'  miss rate {m["miss_rate"]:.2f}, completed '
                                 f'{m["completed"]}/{m["goals"]}, resp mean (all) '
                                 f'{m["resp_mean_all"] or 0:.2f} s, makespan '
                                 f'{m["makespan_s"]:.0f} s')
                    turn += 1
    meta['send_lag_max_s'] = max(lags, default=None)
    meta['runtime_s'] = time.monotonic() - started
    write_outputs({'meta': meta, 'rows': rows}, out_dir, progress)
    return 0


def add_arguments(parser):
    """Add the flags of ``timebill schedbench`` to the argparse ``parser``."""
    parser.add_argument('--out', default='benchmarks/results/sched')
    parser.add_argument('--methods', default='',
                        help='comma list of fifo,edf,luf,muf,slack,up,up-1thread,up+offload, '
                        'up+consolidation,rt-lm,fifo+consolidation,fifo+continuous, and '
                        'up@ALPHA (up with scheduler.up_alpha ALPHA) (default all but '
                        'up@ALPHA)')
    parser.add_argument('--subsets', default='', help='comma list of small,medium,large '
                        '(default all)')
    parser.add_argument('--loads', default='',
                        help='offered loads x capacity, comma list (default 0.5,0.8,1.0,1.2)')
    parser.add_argument('--goals', type=int, default=None, help='goals a subset (default 24)')
    parser.add_argument('--repeats', type=int, default=None,
                        help='traces a cell, each with its own seed (default 2)')
    parser.add_argument('--slack', default='1.5,4.0',
                        help='budget = t^_e2e x a factor uniform in LOW,HIGH')
    parser.add_argument('--budget-basis', choices=('model', 'service'), default='model',
                        help='what the slack factor multiplies: t^_e2e of the calibration, or '
                        'the service time through the server fitted on the capacity sample')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--n-max', type=int, default=128, help='N_max of every goal, tokens')
    parser.add_argument('--max-prompt-tokens', type=int, default=1024,
                        help='leave longer held-out prompts out of the pool (0 = keep all)')
    parser.add_argument('--capacity-sample', type=int, default=6,
                        help='goals a subset run alone to measure capacity')
    parser.add_argument('--calibration', default='', metavar='YAML',
                        help='use this calibration (timebill profile --out) instead of '
                        'profiling at the start')
    parser.add_argument('--lengths', default='data/rlp/lengths.jsonl',
                        help='measured response lengths of the corpus prompts')
    parser.add_argument('--pool', choices=('test', 'val'), default='test',
                        help='prompts of the traces: the corpus\'s test split (the evaluation) '
                        'or its val split (to tune a parameter such as up@ALPHA on)')
    parser.add_argument('--quick', action='store_true',
                        help='smoke test: subset large, loads 0.8,1.2, 12 goals, 1 repeat, '
                        'methods fifo,up (explicit options still win)')
    parser.add_argument('--from-json', default='', metavar='RAW_JSON',
                        help='only re-make md, png and calibration report of a saved run')
    parser.add_argument('--overrun', choices=('kill', 'skip_next'), default='kill',
                        help='every goal\'s overrun policy: kill (a late goal ends at its '
                        'deadline) or skip_next (a running goal finishes late; goals that come '
                        'due in the queue meanwhile are SKIPPED)')
    parser.add_argument('--allow-fallback', action='store_true',
                        help='run even when the RLP is not built (u_J = N_max for every goal)')
