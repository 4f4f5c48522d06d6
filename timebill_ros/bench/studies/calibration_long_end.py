"""Does the start-up calibration of a 0.5B-class file predict long prefills? One process.

    timebill study calibration_long_end [--limit-s 60] [--lengths 2048 8192] [--out DIR]

Makes (once, cached) a random-weight GGUF at Qwen2.5-0.5B's sizes (24 layers, hidden 896, FFN
4864, 14 / 2 heads of 64; Q4_K_M by llama.cpp's quantizer: ``make llama``), runs the server's
few-shot start-up calibration on it twice within ``--limit-s`` - its probes shortest first
(the order before this change) and range-first (the order now) - then measures prefills of
``--lengths`` tokens on the same engine and prints each calibration's prediction over the
measured time. ``--out`` writes the rows (JSON) and the table (.md).
"""

import argparse
import json
import pathlib
import platform
import sys
import time

QWEN05 = dict(hidden=896, ffn=4864, heads=14, kv_heads=2, head_dim=64, layers=24)


def calibrate(engine, order, limit_s):
    """Return the few-shot Calibration with the probes measured in ``order``."""
    from timebill_ros.timing import few_shot
    measure = sorted if order == 'shortest first' else few_shot.range_first
    return few_shot.few_shot_profile(engine, time_limit_s=limit_s, progress=print,
                                     order=measure)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--limit-s', type=float, default=60.0)
    parser.add_argument('--lengths', type=int, nargs='+', default=[2048, 8192])
    parser.add_argument('--out', default='')
    args = parser.parse_args(argv)
    from timebill_ros import paths
    from timebill_ros.bench.gguf_make import Dims, make_q4k_file
    from timebill_ros.config import EngineConfig, EvictionConfig
    from timebill_ros.engine import LlmEngine
    from timebill_ros.engine.stopping import StopCriteria
    path = make_q4k_file(pathlib.Path(paths.cache_root()) / 'models', Dims(**QWEN05))
    engine = LlmEngine.load(EngineConfig(model_path=str(path)), EvictionConfig())
    rows = []
    calibrations = {order: calibrate(engine, order, args.limit_s)
                    for order in ('shortest first', 'range first')}
    for order, calibration in calibrations.items():
        rows.append({'order': order, 'probes': [n for n, _ in calibration.prefill_points],
                     'profiling_s': calibration.profiling_s})
    for n_x in args.lengths:
        state = engine.prefill(engine.random_ids(n_x), StopCriteria())
        for order, calibration in calibrations.items():
            predicted = calibration.coefficients.prefill_s(n_x)
            rows.append({'order': order, 'n_x': n_x, 'measured_s': state.prefill_s,
                         'predicted_s': predicted})
            print(f'{order}: prefill {n_x}: predicted {predicted:.2f} s, measured '
                  f'{state.prefill_s:.2f} s ({predicted / state.prefill_s:.2f}x)', flush=True)
    lines = table(rows)
    print('\n'.join(lines))
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        command = 'timebill study calibration_long_end ' + ' '.join(argv or sys.argv[1:])
        meta = {'command': command, 'host': platform.node(), 'file': path.name,
                'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}
        (out / 'calibration_long_end.json').write_text(
            json.dumps({**meta, 'rows': rows}, indent=1), encoding='utf-8')
        head = [f'# The start-up calibration of a 0.5B-class file at the long end '
                f'({meta["date"]})', '', f'`{command}` on {meta["host"]}, {path.name}; rows: '
                'calibration_long_end.json; the table again: `'
                'timebill study calibration_long_end --table calibration_long_end.json`.', '']
        (out / 'calibration_long_end.md').write_text('\n'.join(head + lines) + '\n',
                                                     encoding='utf-8')
    return 0


def table(rows):
    """Return the markdown table of ``rows``: probes, and predicted / measured per length."""
    orders = list(dict.fromkeys(row['order'] for row in rows))
    lengths = sorted({row['n_x'] for row in rows if 'n_x' in row})
    lines = ['| probe order | probes measured (prompt tokens) | calibration s | '
             + ' | '.join(f'prefill {n}: predicted / measured s' for n in lengths) + ' |',
             '|---|---|---|' + '---|' * len(lengths)]
    for order in orders:
        head = next(r for r in rows if r['order'] == order and 'probes' in r)
        cells = []
        for n in lengths:
            row = next(r for r in rows if r['order'] == order and r.get('n_x') == n)
            cells.append(f"{row['predicted_s']:.1f} / {row['measured_s']:.1f} "
                         f"({row['predicted_s'] / row['measured_s']:.2f}x)")
        lines.append(f"| {order} | {', '.join(map(str, sorted(head['probes'])))} | "
                     f"{head['profiling_s']:.0f} | " + ' | '.join(cells) + ' |')
    return lines


if __name__ == '__main__':
    if len(sys.argv) == 3 and sys.argv[1] == '--table':
        data = json.loads(pathlib.Path(sys.argv[2]).read_text(encoding='utf-8'))
        print('\n'.join(table(data['rows'])))
        sys.exit(0)
    sys.exit(main())
