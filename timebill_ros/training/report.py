"""Train every response-length predictor on the train split and report the test split.

Like TimeBill's Table 1: MAE, RMSE, R^2 (and the share within +-32 tokens) of each predictor
against the target model's own lengths on the held-out test split, which no model trains or
tunes on (val picks the epoch). Lengths are compared capped at N_model (a capped answer counts
as N_model).
"""

import json
import pathlib
import time
from typing import Callable, Dict, List

import numpy as np

from timebill_ros.training.metrics import length_metrics, wcet_coverage, WITHIN_TOKENS
from timebill_ros.training.heads.base import true_lengths
from timebill_ros.predictors.length_distribution import READOUTS

# B = 16 / 32 / 64 as in TimeBill's Table 1, plus B = 8: at N_model = 128, B = 16 gives only
# 8 buckets, coarser than S3's 10 classes; B = 8 (16 buckets) keeps the RLP the finest, as
# the paper's default (512 buckets) is. None = the regression variant.
RLP_BUCKETS = (8, 16, 32, 64, None)
UPPER_Q = 0.9  # the upper quantile of the RLP's bucket distribution whose coverage is reported
WCET_CAPS = (256, None)  # N_max of the N^_W coverage table, tokens (None = N_model)
WCET_FACTORS = (2.0, 5.0)  # k of TimeBill's N^_W = min(k N^, N_max) in that table


def rlp_variants(engine, n_model, feature_cache, log, buckets=RLP_BUCKETS, **kwargs) -> list:
    """Return untrained RLP models (one per B) sharing one trunk feature cache."""
    from timebill_ros.training.heads.rlp import RlpModel
    head = kwargs.pop('head', 'softmax')
    return [RlpModel(engine.model, engine.encode, bucket_tokens=b, n_model=n_model,
                     feature_cache=feature_cache, log=log,
                     head=head if b is not None else 'softmax', **kwargs) for b in buckets]


def readout_variants(engine, n_model, features, log, buckets=(64,), head='ordinal',
                     **kwargs) -> list:
    """Return untrained prefill readouts (one per B) on pooled prefill ``features``."""
    from timebill_ros.training.heads.prefill_readout import PrefillReadoutModel
    from timebill_ros.training.target import final_norm_weight
    return [PrefillReadoutModel(final_norm_weight(engine), engine.n_layers, features,
                                bucket_tokens=b, n_model=n_model, log=log,
                                head=head if b is not None else 'softmax', **kwargs)
            for b in buckets]


def baseline_models(log) -> list:
    """Return the untrained baselines.

    Constant mean, input-length LR, RT-LM rules + MLP, ProxyModel, S3.
    """
    from timebill_ros.training.heads.bert_classifier import proxymodel_5class, s3_10class
    from timebill_ros.training.heads.input_length_lr import InputLengthLR
    from timebill_ros.training.heads.rtlm_mlp import RtlmMlpModel
    from timebill_ros.training.heads.constant_mean import ConstantMean
    return [ConstantMean(), InputLengthLR(), RtlmMlpModel(), proxymodel_5class(),
            s3_10class()]


def _row(model, test, truth, val, fit_s) -> Dict:
    start = time.perf_counter()
    pred = model.predict_tokens(test)
    predict_ms = (time.perf_counter() - start) / len(test) * 1e3
    row = {'predictor': model.name, **length_metrics(truth, pred),
           'val_mae': model.mae(val) if val else float('nan'), 'fit_s': fit_s,
           'predict_ms': predict_ms, 'predicted': pred.tolist()}
    if getattr(model, 'bucket_tokens', None) is not None:  # an RLP bucket distribution
        upper = model.predict_tokens(test, q=UPPER_Q)
        row.update(cover_upper=float((truth <= upper).mean()),
                   upper_over_true=float(np.median(upper / truth)),
                   upper=upper.tolist())
    return row


def evaluate_models(models, splits, log: Callable[[str], None] = print) -> List[Dict]:
    """Fit each model on ``splits['train']`` (val for epoch choice); return test-split rows.

    An RLP classifier is also read the other way (argmax vs median, no retraining), and its
    UPPER_Q quantile's coverage of the true lengths is reported.
    """
    test = splits['test']
    truth = true_lengths(test)
    rows = []
    for model in models:
        start = time.perf_counter()
        model.fit(splits['train'], splits['val'])
        fit_s = time.perf_counter() - start
        trained_readout = getattr(model, 'readout', None)
        readouts = [trained_readout]
        if getattr(model, 'bucket_tokens', None) is not None:
            readouts += [r for r in READOUTS if r != trained_readout]
        for readout in readouts:
            if readout is not None:
                model.readout = readout  # the model's name follows its readout
            row = _row(model, test, truth, splits['val'], fit_s)
            log(format_row(row))
            rows.append(row)
        if trained_readout is not None:
            model.readout = trained_readout
    return rows


def format_row(row: Dict) -> str:
    """Return one Markdown table row of a result dict."""
    cover = (f"{100 * row['cover_upper']:.0f} % ({row['upper_over_true']:.1f}x)"
             if 'cover_upper' in row else '-')
    return (f"| {row['predictor']} | {row['mae']:.1f} | {row['rmse']:.1f} | {row['r2']:.3f} | "
            f"{100 * row['within']:.0f} % | {row['val_mae']:.1f} | {cover} | {row['fit_s']:.0f} | "
            f"{row['predict_ms']:.1f} |")


def format_table(rows: List[Dict], splits) -> str:
    """Return the Markdown report: data summary and one row per predictor."""
    sizes = ', '.join(f'{k} {len(v)}' for k, v in splits.items())
    test = splits['test']
    capped = sum(e.capped for e in test)
    lines = [f'Prompts: {sizes}. Test lengths: mean '
             f'{np.mean([e.n_tokens for e in test]):.1f} tokens, {capped} capped at N_model '
             f'= {test[0].n_model}.', '',
             f'| predictor | MAE (tokens) | RMSE (tokens) | R^2 | within +-{WITHIN_TOKENS} | '
             f'val MAE (tokens) | q={UPPER_Q} quantile covers (median N_q / N) | fit (s) | '
             'predict (ms/prompt) |',
             '|---|---|---|---|---|---|---|---|---|']
    return '\n'.join(lines + [format_row(r) for r in rows])


def format_wcet_table(rows: List[Dict], splits) -> str:
    """Return a Markdown table: how N^_W bounds the test answers, per rule and cap N_max.

    Rules: TimeBill's min(k N^, N_max) for each k in WCET_FACTORS, and (RLP classifiers) the
    UPPER_Q quantile of the bucket distribution, min(N^_q, N_max). Per cell: the share of
    answers (capped at N_max) at most N^_W, and the mean N^_W / N_max in brackets (the
    budget it reserves: 1.0 = every goal budgeted for N_max).
    """
    truth = true_lengths(splits['test'])
    caps = [cap or splits['test'][0].n_model for cap in WCET_CAPS]
    header = ['predictor', 'rule'] + [f'N_max = {cap}' for cap in caps]
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    for row in rows:
        rules = [(f'k = {k:g}', k * np.asarray(row['predicted'])) for k in WCET_FACTORS]
        if 'upper' in row:
            rules.append((f'q = {UPPER_Q} quantile', np.asarray(row['upper'])))
        for rule, n_w in rules:
            cells = []
            for cap in caps:
                cover = wcet_coverage(truth, n_w, cap)
                cells.append(f"{100 * cover['cover']:.0f} % ({cover['mean_fraction']:.2f})")
            lines.append(f"| {row['predictor']} | {rule} | " + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def plot_calibration(rows, splits, path) -> None:
    """Write predicted vs true length (left) and the RLP's upper quantile vs true (right).

    The RLP row drawn is the one with the lowest MAE; the baseline, the best non-RLP row
    (none when the run had no baseline, ``--only RLP``).
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    truth = true_lengths(splits['test'])
    rlp = [r for r in rows if r['predictor'].startswith('RLP')]
    others = [r for r in rows if not r['predictor'].startswith('RLP')]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.5))
    top = float(max(truth.max(), 1.0))
    drawn = [(min(group, key=lambda r: r['mae']), marker)
             for group, marker in ((others, 'x'), (rlp, 'o')) if group]
    for row, marker in drawn:
        left.scatter(truth, row['predicted'], s=12, marker=marker, alpha=0.6,
                     label=f"{row['predictor']} (MAE {row['mae']:.0f})")
    with_upper = [r for r in rlp if 'upper' in r]
    if with_upper:
        best = min(with_upper, key=lambda r: r['mae'])
        right.scatter(truth, best['upper'], s=12, alpha=0.6,
                      label=f"{best['predictor']}: q={UPPER_Q} quantile covers "
                      f"{100 * best['cover_upper']:.0f} %")
    for axis, title in ((left, 'point prediction'), (right, f'upper quantile q={UPPER_Q}')):
        axis.plot([0, top], [0, top], color='grey', linewidth=1)
        axis.set(title=title, xlabel='true response tokens', ylabel='predicted tokens',
                 xlim=(0, top * 1.05), ylim=(0, top * 1.05))
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def save_report(rows, splits, out_dir) -> pathlib.Path:
    """Write ``rlp_eval.md``, ``rlp_eval.json`` and ``rlp_calibration.png`` under ``out_dir``.

    Returns the .md path.
    """
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / 'rlp_eval.json').write_text(json.dumps(rows, indent=1))
    if any(r['predictor'].startswith('RLP') for r in rows):
        plot_calibration(rows, splits, out_dir / 'rlp_calibration.png')
    md = out_dir / 'rlp_eval.md'
    md.write_text('Regenerate: `timebill predictor eval`\n\n' + format_table(rows, splits)
                  + '\n\nN^_W as a bound on the test answers: share of answers <= N^_W (mean '
                  'N^_W / N_max)\n\n' + format_wcet_table(rows, splits) + '\n')
    return md
