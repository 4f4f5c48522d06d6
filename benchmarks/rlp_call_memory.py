"""Peak resident memory of RLP calls: one call, then N threads calling at once.

    python benchmarks/rlp_call_memory.py RLP_ONNX [--tokens 2048] [--threads 3]
        [--out benchmarks/results/reliability/rlp_call_memory.md]

Each figure is the process's VmHWM (Linux: /proc/self/status) after the calls less the
resident memory before them (VmHWM reset through /proc/self/clear_refs); random token ids of
``--tokens`` length (the RLP's cost depends on the length, not on the ids). The predictor
as the node loads it, so its one-call-at-a-time lock applies; ``--no-lock`` makes the same
calls with that lock taken out, as before it.
"""

import argparse
import contextlib
import datetime
import platform
import sys
import threading

import numpy as np

from timebill_ros.predictors.onnx_rlp import OnnxRlpPredictor


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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('rlp')
    parser.add_argument('--tokens', type=int, default=2048)
    parser.add_argument('--threads', type=int, default=3)
    parser.add_argument('--no-lock', action='store_true')
    parser.add_argument('--out', default='')
    args = parser.parse_args(argv)
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
    mode = 'without the one-call lock' if args.no_lock else 'OnnxRlpPredictor.run (the node)'
    lines = [f'# RLP call memory: {args.tokens}-token prompts, {mode}', '',
             f'Command: `python benchmarks/rlp_call_memory.py {" ".join(sys.argv[1:])}`',
             f'Host: {platform.node()}; date {datetime.datetime.now().isoformat("T", "seconds")}',
             '', '| calls | peak above the resident memory before them, MB |', '|---|---|',
             f'| 1 | {one:.0f} |', f'| {args.threads} at once | {many:.0f} |', '']
    text = '\n'.join(lines)
    print(text)
    if args.out:
        with open(args.out, 'a', encoding='utf-8') as stream:
            stream.write(text + '\n')


if __name__ == '__main__':
    main()
