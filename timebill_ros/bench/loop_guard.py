"""The loop guard on the corpus: greedy answers' token ids, and what a guard would cut.

``collect_answers`` keeps the token ids of the engine's greedy answers (EOS or N_model) for a
sample of corpus prompts plus a few structured prompts (tables, numbered lists, code), one
JSON line an answer, resumable. ``scan`` replays a :class:`~timebill_ros.engine.stopping.LoopGuard`
over each answer and reports the share of answers that reached N_model it ends, the tokens it
saves, and where it fires on answers that ended by themselves (false alarms, unless the
answer looped before its EOS).
"""

import json
import pathlib
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
