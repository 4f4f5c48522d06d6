"""The loop guard (engine.loop_guard) on greedy corpus answers: what it ends, saves, misfires.

    python benchmarks/loop_guard.py [--sample 200] [--answers FILE.jsonl] [--out FILE.md]

Collects the embedded model's greedy answers (token ids, up to N_model = 1,024 tokens, the
server's engine and batched decoding; resumable, kept under the cache, not in git) for a
seeded sample of the corpus and six structured prompts (a table, numbered lists, code, JSON,
CSV), then replays the guard over them for a grid of settings: the share of answers that hit
N_model it ends, the tokens that saves, and where it fires on answers that ended by
themselves (read the fired answers: a loop that ended in EOS is not a false alarm).
"""

import argparse
import datetime
import json
import os
import platform


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--sample', type=int, default=200)
    parser.add_argument('--answers', default=None, help='answers JSONL (default: the cache)')
    parser.add_argument('--out', default='benchmarks/results/loop_guard/loop_guard.md')
    args = parser.parse_args(argv)
    from timebill_ros.bench.rows import write_table
    from timebill_ros.config import EngineConfig, EvictionConfig
    from timebill_ros.engine import LlmEngine
    from timebill_ros.paths import cache_root
    from timebill_ros.bench import loop_guard as loops
    from timebill_ros.training.corpus import build_corpus
    answers_path = args.answers or os.path.join(cache_root(), 'loops', 'answers.jsonl')
    engine = LlmEngine.load(EngineConfig(), EvictionConfig())
    items = loops.sample_items(build_corpus(), args.sample)
    prompts = [(it.prompt_id, it.category, it.prompt) for it in items]
    prompts += [(pid, 'structured', text) for pid, text in loops.STRUCTURED]
    loops.collect_answers(engine, prompts, answers_path)
    answers = [json.loads(line) for line in open(answers_path) if line.strip()]
    rows = [loops.scan(answers, period, repeats, span)
            for period in (32, 64, 128) for repeats in (2, 3, 4) for span in (32, 48, 96)]
    lines = ['# Loop guard on greedy corpus answers',
             '', f'{platform.node()}, {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC; '
             f'`python benchmarks/loop_guard.py --sample {args.sample}`; engine '
             f'{engine.engine_config.decode_weights}; {len(answers)} answers.', '',
             '| max_period | min_repeats | min_span | capped answers ended | tokens saved | '
             'median fire at | fired on answers that ended | on structured prompts |',
             '|---|---|---|---|---|---|---|---|']
    for row in rows:
        s = row['settings']
        lines.append(
            f"| {s['max_period']} | {s['min_repeats']} | {s['min_span']} | "
            f"{row['capped_ended']}/{row['capped']} | {row['tokens_saved']}/"
            f"{row['tokens_capped']} | {row['fire_at_median']} | "
            f"{len(row['ended_fired'])}/{row['ended']} {', '.join(row['ended_fired'][:6])} | "
            f"{len(row['structured_fired'])}/{row['structured']} "
            f"{', '.join(row['structured_fired'])} |")
    write_table(args.out, lines, rows)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
