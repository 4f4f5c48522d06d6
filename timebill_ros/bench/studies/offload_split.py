"""What splitting a 2-core CPU between a primary and an offload executor costs.

Decoding speed of the embedded model (lean forward, fp16 steps, 200-token prompt) in three
set-ups, rounds interleaved so the machine's drift hits all alike:
- ``one engine, all threads``: one goal at a time on every core (offload off);
- ``one engine, 1 thread``: one goal on one core (the primary or offload executor of a
  1 + 1 split while the other one idles);
- ``two engines, 1 thread each, at once``: both executors of the split decoding together.
Prints ms/token per goal and the aggregate tokens/s. Each engine binds its thread count on
the thread that runs it (LlmEngine.bind_thread), as the executors do.

    timebill study offload_split [--rounds 5] [--steps 32] [--out FILE.md]
"""

import argparse
import statistics
import sys
import threading

from timebill_ros.config import EngineConfig, EvictionConfig
from timebill_ros.engine import DEFAULT_THREADS, LlmEngine
from timebill_ros.engine.stopping import StopCriteria

PROMPT_TOKENS = 200


def _decode_s_per_token(engine, steps, out):
    engine.bind_thread()
    state = engine.prefill(engine.random_ids(PROMPT_TOKENS), StopCriteria())
    result = engine.decode(state, steps + 1, StopCriteria(), on_tokens=lambda n, t: None,
                           feedback_every=4)
    out.append(result.decode_s / (len(result.token_ids) - 1))


def _in_threads(engines, steps):
    outs = [[] for _ in engines]
    threads = [threading.Thread(target=_decode_s_per_token, args=(e, steps, o))
               for e, o in zip(engines, outs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [o[0] for o in outs]


def main(argv=None):
    """Run the measurement and print (and optionally write) the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--steps', type=int, default=32)
    parser.add_argument('--out', default='')
    args = parser.parse_args(argv)
    full = LlmEngine.load(EngineConfig(), EvictionConfig())
    single = [LlmEngine(EngineConfig(threads=1), EvictionConfig(), model=full.model,
                        tokenizer=full.tokenizer) for _ in range(2)]
    setups = {f'one engine, all {DEFAULT_THREADS} threads': [full],
              'one engine, 1 thread': single[:1],
              'two engines, 1 thread each, at once': single}
    per_token = {name: [] for name in setups}
    for round_ in range(args.rounds):
        for name, engines in setups.items():
            per_token[name].append(_in_threads(engines, args.steps))
            print(f'round {round_}: {name}: '
                  + ', '.join(f'{s * 1e3:.1f}' for s in per_token[name][-1]) + ' ms/token',
                  flush=True)
    lines = ['| set-up | ms/token per goal (median) | aggregate tokens/s | vs all threads |',
             '|---|---|---|---|']
    base = None
    for name, rounds in per_token.items():
        each = [statistics.median(r[i] for r in rounds) for i in range(len(rounds[0]))]
        tokens_s = sum(1.0 / s for s in each)
        base = base or tokens_s
        lines.append(f'| {name} | {" / ".join(f"{s * 1e3:.1f}" for s in each)} | '
                     f'{tokens_s:.1f} | {tokens_s / base:.2f}x |')
    table = '\n'.join(lines)
    print(table)
    if args.out:
        with open(args.out, 'w') as f:
            f.write(f'`timebill study offload_split --rounds {args.rounds} --steps '
                    f'{args.steps}`, {PROMPT_TOKENS}-token prompt, lean fp16 steps\n\n'
                    f'{table}\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
