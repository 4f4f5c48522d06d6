"""What does prefilling in smaller chunks cost? Alternating chunk sizes, one process.

    timebill study chunk_cost [--n-x 2750] [--rounds 2]

Prefills the same ``--n-x`` random tokens in chunks of 512, 256 and 128 tokens (order
reversed every round) and prints seconds per run and the ratio of the medians to 512-token
chunks: the per-chunk overhead that ``TimeModel.prefill_s`` charges as Eq. 4a's c.
"""

import argparse
import statistics
import sys

SIZES = (512, 256, 128)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--n-x', type=int, default=2750)
    parser.add_argument('--rounds', type=int, default=2)
    args = parser.parse_args(argv)
    from timebill_ros.config import EngineConfig, EvictionConfig
    from timebill_ros.engine import LlmEngine, fixed_chunks
    from timebill_ros.engine.stopping import StopCriteria
    engine = LlmEngine.load(EngineConfig(), EvictionConfig())
    ids = engine.random_ids(args.n_x)
    engine.prefill(ids[:256], StopCriteria())  # warm-up
    runs = {size: [] for size in SIZES}
    for i in range(args.rounds):
        for size in (SIZES if i % 2 == 0 else SIZES[::-1]):
            state = engine.prefill(ids, StopCriteria(), chunk_plan=fixed_chunks(size))
            runs[size].append(state.prefill_s)
            print(f'round {i + 1} chunk {size:3d}: {state.n_chunks:2d} chunks '
                  f'{state.prefill_s:6.2f} s', flush=True)
    base = statistics.median(runs[SIZES[0]])
    for size in SIZES:
        median = statistics.median(runs[size])
        print(f'chunk {size:3d}: median {median:6.2f} s, ratio {median / base:.2f}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
