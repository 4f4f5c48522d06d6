"""Whether the pooled prefill states tell which robot-context answers end before N_max.

    timebill study readout_in_domain READOUT.onnx [--features FILE.npz] [--out FILE.md]
    timebill study readout_in_domain --report    # the table from the committed rows

The 108 robot-context items (all of the workload, the Fig. 7 run's Vanilla lengths in
robot_bench_vanilla.json): label 1 where the Vanilla answer ended before N_max = 128. Scores:
the server's readout (trained on the corpus, P(N <= N_max) from its buckets) and an in-domain
L2 logistic regression on the same pooled states, fitted on the other contexts (leave one
context out, and leave one context kind out). AUC, and how many short / long items get
P(short) >= 0.9 (what would let TimeBill budget below N_max). The pooled states (one fp32
prefill per item, ~8 min here) are cached in ``--features``; every item's scores (its label,
the readout's P(short), each fit's held-out P(short)) are kept in ``--json`` with the command,
host and date, which ``--report`` rebuilds the table from. docs/benchmark.md, "where Kill
fails".
"""

import argparse
import json
import os
import pathlib
import sys

import numpy as np
from scipy.optimize import minimize

from timebill_ros.bench.studies.readout_resolution import (p_at_most, pooled_states,
                                                           print_and_write)
from timebill_ros import paths
from timebill_ros.bench.rows import add_rows_arguments, saved_or_measured

N_MAX = 128
LAMBDAS = (0.01, 0.1, 1.0)
VANILLA = 'benchmarks/results/robot_context/robot_bench_vanilla.json'
ROWS = 'benchmarks/results/robot_context/readout_in_domain.json'
GENERAL = 'server readout (corpus), P(N <= 128)'


def _features(readout_path, vanilla):
    from timebill_ros.predictors.prefill_readout import PrefillReadout
    readout = PrefillReadout.load(readout_path)
    rows = {'X': [], 'y': [], 'ctx': [], 'item': [], 'p_general': []}
    for item, pooled in pooled_states(readout.pool_layers):
        rows['item'].append(item.item_id)
        rows['X'].append(np.asarray(pooled, dtype=np.float64).reshape(-1))
        rows['y'].append(int(vanilla[item.item_id]['tokens'] < N_MAX))
        rows['ctx'].append(item.context_id)
        rows['p_general'].append(p_at_most(readout, pooled, N_MAX))
        print(item.item_id, rows['y'][-1], round(rows['p_general'][-1], 3), flush=True)
    return {k: np.array(v) for k, v in rows.items()}


def auc(score, label) -> float:
    """Return the probability that a random positive scores above a random negative."""
    pos, neg = score[label == 1], score[label == 0]
    return float(np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg]))


def fit_logistic(features, labels, lam):
    """Return x -> P(label 1) of an L2 logistic regression on standardized features."""
    mean, scale = features.mean(0), features.std(0) + 1e-6
    z_train = (features - mean) / scale

    def loss(w):
        p = 1.0 / (1.0 + np.exp(-(z_train @ w[:-1] + w[-1])))
        value = -np.mean(labels * np.log(p + 1e-12) + (1 - labels) * np.log(1 - p + 1e-12))
        grad = z_train.T @ (p - labels) / len(labels) + 2 * lam * w[:-1]
        return value + lam * np.sum(w[:-1] ** 2), np.append(grad, np.mean(p - labels))
    w = minimize(loss, np.zeros(z_train.shape[1] + 1), jac=True, method='L-BFGS-B').x
    return lambda x: 1.0 / (1.0 + np.exp(-(((x - mean) / scale) @ w[:-1] + w[-1])))


def _line(name, p, y):
    sure, wrong = int(((p >= 0.9) & (y == 1)).sum()), int(((p >= 0.9) & (y == 0)).sum())
    return (f'| {name} | {auc(p, y):.3f} | {sure} of {int(y.sum())} | '
            f'{wrong} of {int((1 - y).sum())} |')


def held_out_scores(data) -> dict:
    """Return {score name: P(short) of every item} (the readout's, then each fit's held out).

    Each in-domain fit predicts a context (or a context kind) from the others only.
    """
    y, ctx = data['y'], data['ctx']
    kind = np.array([c.split('-')[0] for c in ctx])
    out = {GENERAL: np.asarray(data['p_general'], dtype=float)}
    for groups, name in ((ctx, 'leave one context out'), (kind, 'leave one kind out')):
        for lam in LAMBDAS:
            p = np.zeros(len(y))
            for group in np.unique(groups):
                test = groups == group
                p[test] = fit_logistic(data['X'][~test], y[~test], lam)(data['X'][test])
            out[f'in-domain logistic, {name}, lambda {lam}'] = p
    return out


def report(data) -> str:
    """Return the Markdown table of a run's rows (``data``: the ``--json`` file's content)."""
    rows = data['rows']
    y = np.array([row['short'] for row in rows])
    lines = ['# Do the pooled prefill states tell short robot-context answers from long ones?',
             '', f'{data["date"]}, {data["host"]} ({data["machine"]}), the embedded model, fp32 '
             f'prefill. {len(y)} items, {int(y.sum())} answered in fewer than {N_MAX} tokens. '
             f'Command: `{data["command"]}`; the table rebuilt from the rows by `'
             'timebill study readout_in_domain --report`. A long item called short at >= 0.9 '
             'is a goal budgeted below its length: under Kill, a miss.', '',
             '| score | AUC | P(short) >= 0.9 on short items | ... on long items |',
             '|---|---|---|---|']
    lines += [_line(name, np.array([row['p'][name] for row in rows]), y)
              for name in data['scores']]
    return '\n'.join(lines) + '\n'


def _measure(args):
    """Return every item's label and scores (features from ``--features`` or prefilled)."""
    if os.path.exists(args.features):
        data = dict(np.load(args.features))
    else:
        with open(VANILLA, encoding='utf-8') as f:
            data = _features(args.readout, json.load(f))
        os.makedirs(os.path.dirname(args.features) or '.', exist_ok=True)
        np.savez(args.features, **data)
    scores = held_out_scores(data)
    rows = [{'item': str(item), 'context': str(ctx), 'short': int(short),
             'p': {name: round(float(p[index]), 6) for name, p in scores.items()}}
            for index, (item, ctx, short) in enumerate(zip(data['item'], data['ctx'],
                                                           data['y']))]
    return {'rows': rows, 'scores': list(scores)}


def main(argv=None):
    """Print / write the table: measured (``READOUT.onnx``) or ``--report`` from ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('readout', nargs='?', default='')
    parser.add_argument('--features', default=str(
        pathlib.Path(paths.cache_root()) / 'bench' / 'readout_in_domain.npz'))
    add_rows_arguments(parser, ROWS)
    args = parser.parse_args(argv)
    if not args.report and not args.readout:
        parser.error('name the READOUT.onnx, or --report')
    data = saved_or_measured(args.json, args.report, lambda: _measure(args),
                             'timebill study readout_in_domain READOUT.onnx')
    print_and_write(report(data), args.out)
    return 0


if __name__ == '__main__':
    sys.exit(main())
