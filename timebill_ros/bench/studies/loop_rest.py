"""Does a loop the guard has seen go on until it fires? What steps_to_fire may trust.

    timebill study loop_rest FILE.jsonl [FILE.jsonl ...] [--out DIR]

Each FILE holds a model's collected greedy answers (``timebill predictor build``'s
``*lengths*.jsonl`` under the cache: ``answer_ids``, ``finish``, ``loop_guard``). Over the
answers the guard did not end (EOS or the length cap: every token is there), it replays the
guard token by token and, for each evidence rule (a cycle seen r times over >= t tokens),
counts the steps at which the rule claimed "the guard fires within k tokens" and how many of
those claims the answer outran (it went on longer than k tokens): a claim the checkpoints
would have trusted wrongly. Writes loop_rest.md and loop_rest.json to ``--out``;
``--report --json loop_rest.json --out loop_rest.md`` rebuilds the table from the rows.
"""

import argparse
import json
import pathlib

from timebill_ros.engine import stopping

RULES = ((2, 8), (2, 16), (3, 8), (3, 12), (3, 16))  # (repeats seen, tokens spanned)


def replay(rows, repeats, tokens):
    """Return {answers, answers_claimed, claims, outran} over the unguarded answers."""
    out = {'answers': 0, 'answers_claimed': 0, 'claims': 0, 'outran': 0}
    for row in rows:
        if row['finish'] == stopping.REPETITION:
            continue
        ids, out['answers'] = row['answer_ids'], out['answers'] + 1
        guard = stopping.LoopGuard(*row['loop_guard'])
        claimed = False
        for n, token in enumerate(ids, start=1):
            if guard.should_stop(n, token) is not None:
                break
            steps = guard.steps_to_fire(repeats, tokens)
            if steps is not None:
                claimed = True
                out['claims'] += 1
                out['outran'] += len(ids) - n > steps
        out['answers_claimed'] += claimed
    return out


def table_lines(table):
    """Return the markdown table of the replay's rows (dicts of :func:`replay` + the rule)."""
    lines = ['| answers file | cycle seen | over >= tokens | unguarded answers | with a claim '
             '| claims | outran |', '|---|---|---|---|---|---|---|']
    return lines + [f"| {r['file']} | {r['repeats']} x | {r['tokens']} | {r['answers']} | "
                    f"{r['answers_claimed']} | {r['claims']} | {r['outran']} |" for r in table]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('answers', nargs='*')
    parser.add_argument('--out', default='benchmarks/results/loop_rest',
                        help='the folder (with --report: the table file) to write')
    parser.add_argument('--report', action='store_true',
                        help='rebuild the table from --json (the rows) into --out')
    parser.add_argument('--json', help='with --report: loop_rest.json')
    args = parser.parse_args(argv)
    if args.report:
        table = json.loads(pathlib.Path(args.json).read_text(encoding='utf-8'))
        pathlib.Path(args.out).write_text('\n'.join(table_lines(table)) + '\n')
        return 0
    table = []
    for path in args.answers:
        rows = [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]
        for repeats, tokens in RULES:
            table.append({'file': pathlib.Path(path).name, 'repeats': repeats,
                          'tokens': tokens, **replay(rows, repeats, tokens)})
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / 'loop_rest.json').write_text(json.dumps(table, indent=1) + '\n')
    (out / 'loop_rest.md').write_text('\n'.join(table_lines(table)) + '\n')
    print('\n'.join(table_lines(table)))
    return 0
