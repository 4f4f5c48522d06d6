"""Peak resident memory of RLP calls: one call, then N threads calling at once.

    timebill study rlp_call_memory RLP_ONNX [--tokens 2048] [--threads 3] [--no-lock]
        [--out benchmarks/results/reliability]
    timebill study rlp_call_memory --table benchmarks/results/reliability

``--out DIR`` appends the run's row to DIR/rlp_call_memory.jsonl and rewrites
DIR/rlp_call_memory.md from every row there; ``--table DIR`` only rewrites (and prints) it.

Each figure is the process's VmHWM (Linux: /proc/self/status) after the calls less the
resident memory before them (VmHWM reset through /proc/self/clear_refs); random token ids of
``--tokens`` length (the RLP's cost depends on the length, not on the ids). The predictor
as the node loads it, so its one-call-at-a-time lock applies; ``--no-lock`` makes the same
calls with that lock taken out, as before it.
"""

import argparse
import contextlib
import datetime
import json
import pathlib
import platform
import threading

import numpy as np

from timebill_ros.predictors.onnx_rlp import OnnxRlpPredictor

ROWS = 'rlp_call_memory.jsonl'  # one JSON row a run, in the --out folder


def _status_mb(field):
    with open('/proc/self/status', encoding='ascii') as status:
        for line in status:
            if line.startswith(field + ':'):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f'no {field} in /proc/self/status')


def _peak_above_rss(calls):
    with open('/proc/self/clear_refs', 'w', encoding='ascii') as refs:
        refs.write('5')  # reset VmHWM to the current RSS
    before = _status_mb('VmRSS')
    threads = [threading.Thread(target=call) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return _status_mb('VmHWM') - before


def measure(args):
    """Return the row of one run: peaks above the resident memory of 1 and N calls, MB."""
    predictor = OnnxRlpPredictor.load(args.rlp, threads=1, provider='cpu',
                                      max_input_tokens=args.tokens)
    ids = np.random.default_rng(0).integers(100, predictor.vocab_size, size=args.tokens)
    if args.no_lock:  # the same calls without the lock: as before it
        predictor._run_lock = contextlib.nullcontext()

    def call():
        predictor.run(ids)

    call()  # warm-up
    one = _peak_above_rss([call])
    many = _peak_above_rss([call] * args.threads)
    return {'rlp': args.rlp, 'tokens': args.tokens, 'threads': args.threads,
            'lock': not args.no_lock, 'one_call_mb': round(one, 1),
            'concurrent_mb': round(many, 1), 'host': platform.node(),
            'date': datetime.datetime.now().isoformat('T', 'seconds')}


def table(rows):
    """Return the markdown of ``rows`` (one line a run)."""
    lines = ['# RLP call memory: peak above the resident memory before the calls, MB', '',
             'Command: `timebill study rlp_call_memory RLP_ONNX [--no-lock] --out DIR` '
             'a run; `timebill study rlp_call_memory --table DIR` recomputes this table '
             'from rlp_call_memory.jsonl.', '',
             '| RLP | tokens | lock | 1 call | calls at once | peak of those | host | date |',
             '|---|---|---|---|---|---|---|---|']
    for row in rows:
        lines.append(f"| {pathlib.Path(row['rlp']).name} | {row['tokens']} | "
                     f"{'yes' if row['lock'] else 'no'} | {row['one_call_mb']:.0f} | "
                     f"{row['threads']} | {row['concurrent_mb']:.0f} | {row['host']} | "
                     f"{row['date']} |")
    return '\n'.join(lines) + '\n'


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('rlp', nargs='?')
    parser.add_argument('--tokens', type=int, default=2048)
    parser.add_argument('--threads', type=int, default=3)
    parser.add_argument('--no-lock', action='store_true')
    parser.add_argument('--out', default='')
    parser.add_argument('--table', default='')
    args = parser.parse_args(argv)
    folder = pathlib.Path(args.table or args.out) if (args.table or args.out) else None
    if not args.table:
        if not args.rlp:
            parser.error('give the RLP file (or --table DIR)')
        row = measure(args)
        print(json.dumps(row))
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / ROWS, 'a', encoding='utf-8') as stream:
                stream.write(json.dumps(row) + '\n')
    if folder is not None:
        rows = [json.loads(line) for line in (folder / ROWS).read_text().splitlines() if line]
        text = table(rows)
        (folder / 'rlp_call_memory.md').write_text(text)
        print(text)


if __name__ == '__main__':
    main()
