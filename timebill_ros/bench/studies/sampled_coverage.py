"""Check whether the length predictor's N^_q still covers sampled answers.

    timebill study sampled_coverage [--lengths benchmarks/results/sampling_lengths/
        sampling_lengths.json] [--q 0.9] [--out FILE.md]

Reads the answers of ``bench/studies/sampling_lengths.py`` (greedy and temperature 0.7 with a few
seeds, per corpus prompt) and asks the server's predictors - the RLP and the prefill readout
from the cache, as the server loads them - for N^ and N^_q of each prompt at N_max = 1,024. It
reports, per setting, the share of answers at or under N^_q (what t^_WCET budgets for with
``budget.upper_quantile``) and at or under N^. Lengths are the tokens each answer kept; an
answer the loop guard ended decoded a few more steps than it kept (its cut tail), so the
coverage of those is slightly optimistic.
"""

import argparse
import collections
import datetime
import json
import platform

N_MAX = 1024


def predictions(prompts, q):
    """Return {prompt_id: {'rlp': (N^, N^_q), 'readout': (N^, N^_q)}} for corpus prompts."""
    from timebill_ros.config import ServerConfig
    from timebill_ros.engine import LlmEngine
    from timebill_ros.engine.stopping import StopCriteria
    from timebill_ros.predictors import FallbackPredictor, make_predictor, make_readout
    config = ServerConfig()
    engine = LlmEngine.load(config.engine, config.eviction)
    predictor = make_predictor(config.predictor, engine.model_key)
    readout = make_readout(config.predictor, engine.model_key, n_layers=engine.n_layers)
    if isinstance(predictor, FallbackPredictor) or readout is None:
        raise SystemExit('train and export the RLP and the readout first: make predictor')
    engine.pool_layers = readout.pool_layers
    out = {}
    for prompt_id, text in prompts.items():
        ids = engine.encode(text)
        state = engine.prefill(ids, StopCriteria())
        out[prompt_id] = {'rlp': predictor.predict_bounds(text, ids, N_MAX, q),
                          'readout': readout.predict_bounds(state.pooled, N_MAX, q)}
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--lengths', default='benchmarks/results/sampling_lengths/'
                                             'sampling_lengths.json')
    parser.add_argument('--q', type=float, default=0.9)
    parser.add_argument('--out', default='benchmarks/results/sampling_lengths/'
                                         'sampled_coverage.md')
    args = parser.parse_args(argv)
    from timebill_ros.bench.rows import write_table
    from timebill_ros.training.corpus import build_corpus
    rows = json.loads(open(args.lengths, encoding='utf-8').read())
    corpus = {it.prompt_id: it for it in build_corpus()}
    predicted = predictions({r['prompt_id']: corpus[r['prompt_id']].prompt for r in rows},
                            args.q)
    by_setting = collections.defaultdict(list)
    for row in rows:
        setting = 'greedy' if row['setting'] == 'greedy' else 'sampled'
        by_setting[setting].append(row)
        if corpus[row['prompt_id']].split != 'train':  # prompts the predictors never saw
            by_setting[f'{setting}, val + test prompts'].append(row)
    lines = ['# N^_q against sampled answer lengths', '',
             f'{platform.node()}, {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC; '
             f'`timebill study sampled_coverage --q {args.q}` on the answers of '
             f'`{args.lengths}`; N_max {N_MAX}.', '',
             '| predictor | answers | n | <= N^_q | <= N^ | median N^_q / length |',
             '|---|---|---|---|---|---|']
    out_rows = []
    for name in ('readout', 'rlp'):
        for setting, group in sorted(by_setting.items()):
            covered = [r['tokens'] <= predicted[r['prompt_id']][name][1] for r in group]
            under = [r['tokens'] <= predicted[r['prompt_id']][name][0] for r in group]
            ratio = sorted(predicted[r['prompt_id']][name][1] / max(r['tokens'], 1)
                           for r in group)
            lines.append(f'| {name} | {setting} | {len(group)} | '
                         f'{sum(covered) / len(group):.0%} | {sum(under) / len(group):.0%} | '
                         f'{ratio[len(ratio) // 2]:.2f} |')
            out_rows.append({'predictor': name, 'answers': setting, 'n': len(group),
                             'covered_q': sum(covered), 'covered_hat': sum(under)})
    write_table(args.out, lines, out_rows)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
