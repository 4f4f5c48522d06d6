"""The loop guard (engine.loop_guard) on greedy corpus answers: what it ends, saves, misfires.

    timebill study loop_guard [--sample 200] [--answers FILE.jsonl] [--out FILE.md]

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
import pathlib
import platform
import random
import time
from typing import Callable, Iterable, List

from timebill_ros.engine.stopping import LoopGuard

# Prompts whose good answers repeat structure: a guard must let them through.
STRUCTURED = (
    ('table-0', 'Write a markdown table of 12 warehouse robots with columns id, battery %, '
                'dock and status.'),
    ('list-0', 'List 20 numbered steps to inspect a mobile robot before a shift.'),
    ('code-0', 'Write a Python function that returns the shortest path on a grid with BFS, '
               'with comments.'),
    ('json-0', 'Give a JSON array of 10 waypoints, each {"x": number, "y": number, '
               '"speed": number}.'),
    ('csv-0', 'Write 15 lines of CSV with columns time,robot,event for a robot fleet log.'),
    ('list-1', 'Name 25 objects a home robot may find in a kitchen, one per line, numbered.'),
)


def sample_items(items, n: int, seed: int = 0) -> list:
    """Return ``n`` corpus items drawn with ``seed`` (all when n >= len(items))."""
    items = list(items)
    return items if n >= len(items) else random.Random(seed).sample(items, n)


def collect_answers(engine, prompts: Iterable[tuple], out_path, n_model: int = 1024,
                    max_batch: int = 8, log: Callable[[str], None] = print) -> int:
    """Append ``{prompt_id, category, tokens, capped}`` for each prompt not in ``out_path``.

    prompts: ``(prompt_id, category, prompt text)``. Greedy answers on the engine's batched
    decoding, EOS or ``n_model`` tokens (the EOS not kept). Returns how many were added.
    """
    from timebill_ros.engine.stopping import EosStop, StopCriteria
    out_path = pathlib.Path(out_path)
    done = set()
    if out_path.exists():
        done = {json.loads(line)['prompt_id'] for line in out_path.open() if line.strip()}
    pending = [p for p in prompts if p[0] not in done]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    batch, of_row, start, n_done = engine.new_batch(), {}, time.monotonic(), 0
    with out_path.open('a') as out:
        while pending or len(batch):
            while pending and len(batch) < max_batch:
                prompt_id, category, text = pending.pop(0)
                state = engine.prefill(engine.encode(text), StopCriteria())
                row = batch.join(state, n_model, StopCriteria([EosStop(engine.eos_token_ids)]))
                of_row[row] = (prompt_id, category)
            for row, result in batch.step():
                prompt_id, category = of_row.pop(row)
                out.write(json.dumps({'prompt_id': prompt_id, 'category': category,
                                      'tokens': result.token_ids,
                                      'capped': result.stop_reason != 'eos'}) + '\n')
                out.flush()
                n_done += 1
                if n_done % max_batch == 0:
                    log(f'{n_done} answers, {time.monotonic() - start:.0f} s, '
                        f'{len(pending)} prompts left')
    return n_done


def fire_point(tokens: List[int], guard: LoopGuard):
    """Return ``(fired at token count, tokens kept)`` of ``guard`` over ``tokens``, or None."""
    for index, token in enumerate(tokens, start=1):
        if guard.should_stop(index, token) is not None:
            return index, guard.answer_tokens(tokens[:index])
    return None


def scan(answers: List[dict], max_period: int, min_repeats: int, min_span: int) -> dict:
    """Return what a guard with these settings does on ``answers`` (collect_answers' rows)."""
    capped = [a for a in answers if a['capped']]
    ended = [a for a in answers if not a['capped'] and not a['prompt_id'].startswith(
        tuple(p for p, _ in STRUCTURED))]
    structured = [a for a in answers if a['prompt_id'] in {p for p, _ in STRUCTURED}]

    def fired(group):
        out = []
        for answer in group:
            point = fire_point(answer['tokens'],
                               LoopGuard(max_period, min_repeats, min_span))
            out.append((answer, point))
        return out

    capped_runs, ended_runs, structured_runs = fired(capped), fired(ended), fired(structured)
    stopped = [(a, p) for a, p in capped_runs if p is not None]
    return {
        'settings': {'max_period': max_period, 'min_repeats': min_repeats,
                     'min_span': min_span},
        'capped': len(capped), 'capped_ended': len(stopped),
        'tokens_saved': sum(len(a['tokens']) - p[0] for a, p in stopped),
        'tokens_capped': sum(len(a['tokens']) for a in capped),
        'fire_at_median': _median([p[0] for _, p in stopped]),
        'ended': len(ended),
        'ended_fired': [a['prompt_id'] for a, p in ended_runs if p is not None],
        'structured': len(structured),
        'structured_fired': [a['prompt_id'] for a, p in structured_runs if p is not None],
    }


def _median(values):
    values = sorted(values)
    return values[len(values) // 2] if values else None


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
    from timebill_ros.training.corpus import build_corpus
    answers_path = args.answers or os.path.join(cache_root(), 'loops', 'answers.jsonl')
    engine = LlmEngine.load(EngineConfig(), EvictionConfig())
    items = sample_items(build_corpus(), args.sample)
    prompts = [(it.prompt_id, it.category, it.prompt) for it in items]
    prompts += [(pid, 'structured', text) for pid, text in STRUCTURED]
    collect_answers(engine, prompts, answers_path)
    answers = [json.loads(line) for line in open(answers_path) if line.strip()]
    rows = [scan(answers, period, repeats, span)
            for period in (32, 64, 128) for repeats in (2, 3, 4) for span in (32, 48, 96)]
    lines = ['# Loop guard on greedy corpus answers',
             '', f'{platform.node()}, {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC; '
             f'`timebill study loop_guard --sample {args.sample}`; engine '
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
