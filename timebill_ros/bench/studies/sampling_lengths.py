"""How sampling moves answer lengths: greedy against temperature 0.7 with a few seeds.

    timebill study sampling_lengths [--prompts 40] [--seeds 3] [--out FILE.md]

A seeded sample of corpus prompts, each answered greedily and at temperature 0.7 with
``--seeds`` seeds, on the server's engine and batched decoding, with the server's stop
criteria (EOS, N_model = 1,024, the loop guard at its defaults). Reports each setting's
lengths and endings, and per prompt the sampled lengths over the greedy one.
"""

import argparse
import datetime
import platform
import statistics


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--prompts', type=int, default=40)
    parser.add_argument('--seeds', type=int, default=3)
    parser.add_argument('--temperature', type=float, default=0.7)
    parser.add_argument('--out', default='benchmarks/results/sampling_lengths/'
                                         'sampling_lengths.md')
    args = parser.parse_args(argv)
    from timebill_ros.bench.rows import write_table
    from timebill_ros.config import EngineConfig, EvictionConfig
    from timebill_ros.engine import LlmEngine
    from timebill_ros.engine.sampling import Sampler, SamplingConfig
    from timebill_ros.engine.stopping import EosStop, LoopGuard, StopCriteria
    from timebill_ros.training.corpus import build_corpus
    from timebill_ros.training.loops import sample_items
    config = EngineConfig()
    engine = LlmEngine.load(config, EvictionConfig())
    items = sample_items(build_corpus(), args.prompts, seed=1)
    settings = [('greedy', None)] + [(f'T{args.temperature} seed {s}', s)
                                     for s in range(1, args.seeds + 1)]
    pending = [(item, name, seed) for item in items for name, seed in settings]
    batch, of_row, rows = engine.new_batch(), {}, []
    while pending or len(batch):
        while pending and len(batch) < 8:
            item, name, seed = pending.pop(0)
            state = engine.prefill(engine.encode(item.prompt), StopCriteria())
            sampler = None if seed is None else Sampler(
                SamplingConfig(temperature=args.temperature, seed=seed))
            stop = StopCriteria([EosStop(engine.eos_token_ids),
                                 LoopGuard(config.loop_guard_max_period,
                                           config.loop_guard_min_repeats,
                                           config.loop_guard_min_span)])
            of_row[batch.join(state, 1024, stop, sampler=sampler)] = (item, name)
        for row, result in batch.step():
            item, name = of_row.pop(row)
            rows.append(dict(prompt_id=item.prompt_id, setting=name,
                             tokens=len(result.token_ids), stop=result.stop_reason))
            if len(rows) % 40 == 0:
                print(f'{len(rows)} answers')
    lines = ['# Answer lengths: greedy against sampling', '',
             f'{platform.node()}, {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC; '
             f'`timebill study sampling_lengths --prompts {args.prompts} --seeds '
             f'{args.seeds}`; engine {engine.engine_config.decode_weights}, loop guard on, '
             'N_model 1,024.', '',
             '| setting | answers | median tokens | mean tokens | eos | repetition | 1,024 cap |',
             '|---|---|---|---|---|---|---|']
    for name, _ in settings:
        group = [r for r in rows if r['setting'] == name]
        count = {k: sum(r['stop'] == k for r in group)
                 for k in ('eos', 'repetition', 'max_tokens')}
        lines.append(f"| {name} | {len(group)} | {statistics.median(r['tokens'] for r in group)}"
                     f" | {statistics.mean(r['tokens'] for r in group):.0f} | {count['eos']} | "
                     f"{count['repetition']} | {count['max_tokens']} |")
    greedy = {r['prompt_id']: r['tokens'] for r in rows if r['setting'] == 'greedy'}
    ratios = sorted(r['tokens'] / max(greedy[r['prompt_id']], 1) for r in rows
                    if r['setting'] != 'greedy')
    quart = statistics.quantiles(ratios, n=4)
    spread = []
    for item in items:
        lengths = [r['tokens'] for r in rows if r['prompt_id'] == item.prompt_id
                   and r['setting'] != 'greedy']
        spread.append(max(lengths) / max(min(lengths), 1))
    lines += ['', 'Sampled length / greedy length, per answer: median '
              f'{statistics.median(ratios):.2f}, quartiles {quart[0]:.2f} - {quart[2]:.2f}, '
              f'range {ratios[0]:.2f} - {ratios[-1]:.2f}; '
              f'{sum(r > 1.5 for r in ratios)} of {len(ratios)} are over 1.5x, '
              f'{sum(r < 1 / 1.5 for r in ratios)} under 1/1.5x.',
              f'Longest over shortest of the {args.seeds} seeds of a prompt: median '
              f'{statistics.median(spread):.2f}, max {max(spread):.2f}.']
    write_table(args.out, lines, rows)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
