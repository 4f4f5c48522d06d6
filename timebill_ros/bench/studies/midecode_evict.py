"""What does an eviction during decoding cost? The engine's own eviction, one process.

    timebill study midecode_evict [--n-kv 1000 3000] [--rounds 3] [--out DIR]

For each cache size: prefill ``n_kv`` random tokens, decode 16 tokens on the whole cache, then
evict to alpha = 0.5 (the first eviction: the scorer reads the prefill's kept inputs, then
the gather), decode 16 more, evict to alpha = 0.75 (a later eviction: only the gather over
the kept scores), and for comparison the same first eviction right after a prefill (what
the time model's ``evict`` phase has measured until now). Prints seconds per eviction and
the start-up calibration's evict_s prior; ``--out`` writes the rows (JSON) and a table (.md).
"""

import argparse
import json
import pathlib
import platform
import statistics
import sys
import time


def one_round(engine, n_kv):
    """Return {kind: seconds} of the three evictions at ``n_kv`` cached tokens."""
    from timebill_ros.engine.stopping import StopCriteria
    ids = engine.random_ids(n_kv)
    out = {}
    state = engine.prefill(ids, StopCriteria())
    start = time.perf_counter()
    engine.evict(state, 0.5)
    out['after the prefill (scoring + gather)'] = time.perf_counter() - start
    state = engine.prefill(ids, StopCriteria())
    times = []

    def checkpoint(n_generated):
        if n_generated in (17, 33):
            start = time.perf_counter()
            engine.evict(state, 0.5 if n_generated == 17 else 0.75, keep_inputs=True)
            times.append(time.perf_counter() - start)
        return None

    engine.decode(state, 40, StopCriteria(), checkpoint=checkpoint)
    out['during decoding, first (scoring + gather)'] = times[0]
    out['during decoding, later (gather only)'] = times[1]
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--n-kv', type=int, nargs='+', default=[1000, 3000])
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--out', default='')
    args = parser.parse_args(argv)
    from timebill_ros.config import EngineConfig, EvictionConfig
    from timebill_ros.engine import LlmEngine
    from timebill_ros.timing.online import EVICT_PRIOR_S_PER_TOKEN
    engine = LlmEngine.load(EngineConfig(), EvictionConfig())
    one_round(engine, 256)  # warm-up
    rows = []
    for n_kv in args.n_kv:
        for round_index in range(args.rounds):
            for kind, seconds in one_round(engine, n_kv).items():
                rows.append({'n_kv': n_kv, 'round': round_index, 'kind': kind, 's': seconds})
                print(f'n_kv {n_kv} round {round_index}: {kind}: {seconds * 1e3:.1f} ms',
                      flush=True)
    lines = table(rows, EVICT_PRIOR_S_PER_TOKEN)
    print('\n'.join(lines))
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        command = 'timebill study midecode_evict ' + ' '.join(argv or sys.argv[1:])
        meta = {'command': command, 'host': platform.node(), 'machine': platform.processor()
                or platform.machine(), 'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}
        (out / 'midecode_evict.json').write_text(json.dumps({**meta, 'rows': rows}, indent=1),
                                                 encoding='utf-8')
        head = [f'# Eviction during decoding: its cost ({meta["date"]})', '',
                f'`{command}` on {meta["host"]}; rows: midecode_evict.json; the table '
                'again from them: `timebill study midecode_evict --table '
                'midecode_evict.json`.', '']
        (out / 'midecode_evict.md').write_text('\n'.join(head + lines) + '\n',
                                               encoding='utf-8')
    return 0


def table(rows, prior_s_per_token):
    """Return the markdown table of ``rows``: the median milliseconds over rounds."""
    kinds = list(dict.fromkeys(row['kind'] for row in rows))
    sizes = sorted({row['n_kv'] for row in rows})
    lines = ['| eviction | ' + ' | '.join(f'{n} KV tokens, ms' for n in sizes) + ' |',
             '|---|' + '---|' * len(sizes)]
    for kind in kinds:
        cells = [statistics.median(r['s'] for r in rows if r['kind'] == kind
                                   and r['n_kv'] == n) * 1e3 for n in sizes]
        lines.append(f'| {kind} | ' + ' | '.join(f'{c:.1f}' for c in cells) + ' |')
    lines.append('| time model prior before any is measured (evict_s) | ' + ' | '.join(
        f'{prior_s_per_token * n * 1e3:.1f}' for n in sizes) + ' |')
    return lines


if __name__ == '__main__':
    if len(sys.argv) == 3 and sys.argv[1] == '--table':
        from timebill_ros.timing.online import EVICT_PRIOR_S_PER_TOKEN
        data = json.loads(pathlib.Path(sys.argv[2]).read_text(encoding='utf-8'))
        print('\n'.join(table(data['rows'], EVICT_PRIOR_S_PER_TOKEN)))
        sys.exit(0)
    sys.exit(main())
