"""What do the per-layer stop checks cost a decoding step? Alternating runs, one process.

    timebill study stop_check_cost [--rounds 6] [--steps 32] [--n-kv 512]

Each round decodes ``--steps`` tokens after the same ``--n-kv``-token prefill twice, once
with the interrupt criteria the server uses (cancel event + Kill deadline, checked before
every decoder layer) and once without, in alternating order; prints ms/step per round and the
ratio of the medians.
"""

import argparse
import statistics
import sys
import threading
import time


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--rounds', type=int, default=6)
    parser.add_argument('--steps', type=int, default=32)
    parser.add_argument('--n-kv', type=int, default=512)
    args = parser.parse_args(argv)
    from timebill_ros.config import EngineConfig, EvictionConfig
    from timebill_ros.engine import LlmEngine
    from timebill_ros.engine.stopping import CancelStop, DeadlineStop, StopCriteria
    engine = LlmEngine.load(EngineConfig(), EvictionConfig())
    ids = engine.random_ids(args.n_kv)
    interrupt = StopCriteria([CancelStop(threading.Event()),
                              DeadlineStop(time.monotonic() + 1e6)])
    runs = {'with checks': [], 'without': []}
    engine.decode(engine.prefill(ids, StopCriteria()), 5, StopCriteria())  # warm-up
    for i in range(args.rounds):
        order = [('with checks', interrupt), ('without', None)]
        for label, checks in (order if i % 2 == 0 else order[::-1]):
            state = engine.prefill(ids, StopCriteria())
            out = engine.decode(state, args.steps + 1,
                                StopCriteria(checks.criteria if checks else []),
                                interrupt=checks)
            runs[label].append(out.decode_s / args.steps * 1e3)
    for label, values in runs.items():
        print(f'{label:12s} ms/step: median {statistics.median(values):.2f}  rounds '
              + ' '.join(f'{v:.1f}' for v in values))
    ratio = statistics.median(runs['with checks']) / statistics.median(runs['without'])
    print(f'ratio with / without checks: {ratio:.3f} (N_kv {args.n_kv}, {args.steps} steps, '
          f'{args.rounds} rounds)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
