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

from timebill_ros.rlp.metrics import WITHIN_TOKENS, length_metrics
from timebill_ros.rlp.models.base import true_lengths

# B = 16 / 32 / 64 as in TimeBill's Table 1, plus B = 8: at N_model = 128, B = 16 gives only
# 8 buckets, coarser than S3's 10 classes; B = 8 (16 buckets) keeps the RLP the finest, as
# the paper's default (512 buckets) is. None = the regression variant.
RLP_BUCKETS = (8, 16, 32, 64, None)


def rlp_variants(engine, n_model, feature_cache, log, buckets=RLP_BUCKETS, **kwargs) -> list:
    """Return untrained RLP models (one per B) sharing one trunk feature cache."""
    from timebill_ros.rlp.models.rlp import RlpModel
    return [RlpModel(engine.model, engine.encode, bucket_tokens=b, n_model=n_model,
                     feature_cache=feature_cache, log=log, **kwargs) for b in buckets]


def baseline_models(log) -> list:
    """Return the untrained baselines: input-length LR, RT-LM rules + MLP, ProxyModel, S3."""
    from timebill_ros.rlp.models.bert_classifier import proxymodel_5class, s3_10class
    from timebill_ros.rlp.models.input_length_lr import InputLengthLR
    from timebill_ros.rlp.models.rtlm_mlp import RtlmMlpModel
    return [InputLengthLR(), RtlmMlpModel(), proxymodel_5class(), s3_10class()]


def evaluate_models(models, splits, log: Callable[[str], None] = print) -> List[Dict]:
    """Fit each model on ``splits['train']`` (val for epoch choice); return test-split rows."""
    test = splits['test']
    truth = true_lengths(test)
    rows = []
    for model in models:
        start = time.perf_counter()
        model.fit(splits['train'], splits['val'])
        fit_s = time.perf_counter() - start
        start = time.perf_counter()
        pred = model.predict_tokens(test)
        predict_ms = (time.perf_counter() - start) / len(test) * 1e3
        val_mae = model.mae(splits['val'])
        row = {'predictor': model.name, **length_metrics(truth, pred), 'val_mae': val_mae,
               'fit_s': fit_s, 'predict_ms': predict_ms}
        log(format_row(row))
        rows.append(row)
    return rows


def format_row(row: Dict) -> str:
    """Return one Markdown table row of a result dict."""
    return (f"| {row['predictor']} | {row['mae']:.1f} | {row['rmse']:.1f} | {row['r2']:.3f} | "
            f"{100 * row['within']:.0f} % | {row['val_mae']:.1f} | {row['fit_s']:.0f} | "
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
             'val MAE (tokens) | fit (s) | predict (ms/prompt) |',
             '|---|---|---|---|---|---|---|---|']
    return '\n'.join(lines + [format_row(r) for r in rows])


def save_report(rows, splits, out_dir) -> pathlib.Path:
    """Write ``rlp_eval.md`` and ``rlp_eval.json`` under ``out_dir``; return the .md path."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / 'rlp_eval.json').write_text(json.dumps(rows, indent=1))
    md = out_dir / 'rlp_eval.md'
    md.write_text('Regenerate: `timebill predictor eval`\n\n' + format_table(rows, splits) + '\n')
    return md
