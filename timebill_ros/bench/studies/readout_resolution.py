"""Whether a finer length resolution changes TimeBill's N^_W on the robot-context items.

    timebill study readout_resolution NAME=READOUT.onnx [NAME=READOUT.onnx ...]
        [--raw benchmarks/results/robot_context/robot_bench_raw.json] [--out FILE.md]
    timebill study readout_resolution --report    # the table from the committed rows

Each prefill readout (``timebill predictor readout --bucket B --export --onnx FILE``) reads the
pooled prefill states of the Fig. 7 run's 60 items (context + question, fp32 prefill, the
embedded model), as the server does: N^ (the median bucket's upper edge), N^_W (the 0.9
quantile's, at N_max 128) and P(N > N_max), set beside each item's Vanilla length N_v (the run's
1.25 t_v Kill row). Every item's row is kept in ``--json`` (with the command, host and date),
which ``--report`` rebuilds the table from. docs/benchmark.md, "where Kill fails".
"""

import argparse
import json
import statistics
import sys

from timebill_ros.bench.rows import add_rows_arguments, saved_or_measured

from timebill_ros.bench.robot_bench import CONTEXT_SIZES
from timebill_ros.bench.robot_context import build_workload
from timebill_ros.config import EngineConfig, EvictionConfig, PrefixCacheConfig
from timebill_ros.engine import LlmEngine
from timebill_ros.engine.stopping import StopCriteria
from timebill_ros.predictors.contract import read_metadata
from timebill_ros.predictors.prefill_readout import PrefillReadout
from timebill_ros.predictors.length_distribution import bucket_cdf

N_MAX, Q = 128, 0.9
ROWS = 'benchmarks/results/robot_context/readout_resolution.json'


def _vanilla_lengths(raw):
    return {r['item']: r['response_tokens'] for r in raw['rows']
            if r['method'] == 'vanilla' and r['policy'] == 'kill' and r['fraction'] == 1.25}


def pooled_states(pool_layers, item_ids=None):
    """Yield (item, pooled prefill states) of the robot-context items, as the server pools.

    The embedded model with an fp32 prefill and no prefix store, pooling ``pool_layers`` (a
    readout's); item_ids: these items in this order (None: the whole workload).
    """
    engine = LlmEngine.load(EngineConfig(prefill_dtype='float32'), EvictionConfig(),
                            prefix_cache=PrefixCacheConfig(enabled=False))
    engine.pool_layers = pool_layers
    items = {item.item_id: item for item in build_workload(
        lambda text: len(engine.encode(text)), sizes=CONTEXT_SIZES)}
    for item_id in items if item_ids is None else item_ids:
        item = items[item_id]
        yield item, engine.prefill(engine.encode(item.prompt), StopCriteria()).pooled


def p_at_most(readout, pooled, n_tokens=N_MAX):
    """Return the readout's P(N <= n_tokens) for ``pooled``, n_tokens a bucket edge."""
    cdf = bucket_cdf(readout.run(pooled))
    return float(cdf[n_tokens // readout.format.bucket_tokens - 1])


def print_and_write(text, out=''):
    """Print the report ``text``; write it to ``out`` too unless empty."""
    print(text)
    if out:
        with open(out, 'w', encoding='utf-8') as f:
            f.write(text)


def _row(readout, pooled):
    n_hat, n_w = readout.predict_bounds(pooled, N_MAX, Q)
    return n_hat, n_w, 1.0 - p_at_most(readout, pooled)


def _count(values):
    return ', '.join(f'{v} ({values.count(v)})' for v in sorted(set(values)))


def _report(data):
    """Return the Markdown table of a run's rows (``data``: the ``--json`` file's content)."""
    rows, names = data['rows'], data['names']
    readouts = ', '.join(f'{n}: {data["readouts"][n]}' for n in names)
    lines = [f'# N^ and N^_W (q = {Q}, N_max {N_MAX}) of prefill readouts on the robot-context '
             'items', '', f'{data["date"]}, {data["host"]} ({data["machine"]}), the embedded '
             f'model, fp32 prefill. Readouts: {readouts}. {len(rows)} items; command: '
             f'`{data["command"]}`; the table rebuilt from the rows by `'
             'timebill study readout_resolution --report`.', '',
             '| readout | N^ values (count) | N^_W values (count) | N^ MAE vs N_v | '
             'P(N > N_max): median, min, max | on the items with N_v < N_max |',
             '|---|---|---|---|---|---|']
    for name in names:
        n_hats = [r[name][0] for r in rows]
        n_ws = [r[name][1] for r in rows]
        over = [r[name][2] for r in rows]
        short = [r for r in rows if r['n_v'] < N_MAX]
        mae = statistics.mean(abs(r[name][0] - r['n_v']) for r in rows)
        lines.append(f'| {name} | {_count(n_hats)} | {_count(n_ws)} | {mae:.1f} | '
                     f'{statistics.median(over):.2f}, {min(over):.2f}, {max(over):.2f} | '
                     + ', '.join(f'N_v {r["n_v"]}: N^ {r[name][0]}, N^_W {r[name][1]}, '
                                 f'P {r[name][2]:.2f}' for r in short) + ' |')
    return '\n'.join(lines) + '\n'


def _measure(args):
    """Return the run's rows: every item's N_v and each readout's (N^, N^_W, P(N > N_max))."""
    paths = dict(arg.split('=', 1) for arg in args.readouts)
    readouts = {name: PrefillReadout.load(path) for name, path in paths.items()}
    layers = {r.pool_layers for r in readouts.values()}
    if len(layers) != 1:
        sys.exit(f'the readouts pool different layers: {layers}')
    with open(args.raw, encoding='utf-8') as f:
        raw = json.load(f)
    n_v = _vanilla_lengths(raw)
    rows = []
    for item, pooled in pooled_states(layers.pop(), raw['items']):
        rows.append({'item': item.item_id, 'n_v': n_v[item.item_id],
                     **{name: _row(r, pooled) for name, r in readouts.items()}})
        print(rows[-1], flush=True)
    described = {name: '{name}, {train_prompts} training prompts'.format_map(
        read_metadata(r.session)) for name, r in readouts.items()}
    return {'rows': rows, 'names': list(readouts), 'readouts': described}


def main(argv=None):
    """Print and optionally write the table (measured, or ``--report``: from ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('readouts', nargs='*', help='NAME=PATH of a readout ONNX file')
    parser.add_argument('--raw', default='benchmarks/results/robot_context/robot_bench_raw.json')
    add_rows_arguments(parser, ROWS)
    args = parser.parse_args(argv)
    if not args.report and not args.readouts:
        parser.error('name at least one NAME=READOUT.onnx, or --report')
    command = 'timebill study readout_resolution ' + ' '.join(
        f'{arg.split("=", 1)[0]}=...' for arg in args.readouts)
    data = saved_or_measured(args.json, args.report, lambda: _measure(args), command)
    print_and_write(_report(data), args.out)
    return 0


if __name__ == '__main__':
    sys.exit(main())
