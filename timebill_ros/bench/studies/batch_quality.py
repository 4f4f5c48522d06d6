"""TimeBill's side of consolidation: the same goals batched and alone, at the same budgets.

    timebill study batch_quality --out benchmarks/results/batch_quality

Issue 13 asks for the completion rate and ROUGE-L of batched goals against the same goals
run alone, at the same budgets, and for how far batched answers agree with the answers alone.
One server core (``factory.build_service``: the embedded model, its cached calibration, the
ONNX RLP, Kill) with ``scheduler.consolidation`` on, ``scheduler.batch_size`` 4 and
``scheduler.length_ratio`` 1000, so every group of four queued goals decodes as one batch.

Prompts: the 12 held-out RLP prompts of the smallest response-length variance
(``scheduling.workload.make_subsets``: similar lengths, the goals consolidation batches).
1. Reference: each prompt alone with a 600 s budget (alpha* = 0): its text and t_e2e.
2. For each budget factor f: budget = f x the prompt's reference t_e2e + the blocker's time.
   "alone": a blocker goal (an answer of at most 8 tokens) starts on the idle server, then
   the goal is queued behind it;
   "batched": a blocker starts, then four goals are queued behind it and leave the queue as
   one batch. Both modes wait for the same blocker, so the budgets mean the same; the modes
   alternate group by group. f = 0 stands for the 600 s budget (agreement at alpha* = 0).
Per (f, mode): completed on time, ROUGE-L F against the reference (a goal without an answer
scores 0), eviction ratio, t_e2e; at f = 0 the share of batched answers identical to the
answers alone and the mean token position of the first difference.
"""

import argparse
import json
import pathlib
import statistics
import tempfile
import threading
import time

FACTORS = (0.0, 3.0, 2.0, 1.5, 1.0)
GENEROUS_S = 600.0
BLOCKER = 'Reply with one word: OK.'
BLOCKER_N = 8  # tokens: long enough for four goals to be queued before it ends
GROUP = 4
TIMEOUT_S = 600.0


class _Goal:
    """Collects one goal's result (on_done is called exactly once)."""

    def __init__(self):
        self.done = threading.Event()
        self.result = None
        self.job = None

    def on_feedback(self, feedback):
        pass

    def on_done(self, result):
        self.result = result
        self.done.set()


def _submit(service, GoalRequest, kill, prompt, budget_s, max_new_tokens=0):
    goal = _Goal()
    request = GoalRequest(prompt, budget_s=budget_s, max_new_tokens=max_new_tokens,
                          overrun_policy=kill)
    goal.job = service.submit(request, goal.on_feedback, goal.on_done)
    return goal


def _wait(goals):
    for goal in goals:
        if not goal.done.wait(TIMEOUT_S):
            raise RuntimeError('a goal got no result')
    return [goal.result for goal in goals]


def _poll(condition, what):
    """Wait until ``condition()`` is true (RuntimeError naming ``what`` after TIMEOUT_S)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f'{what} did not happen')
        time.sleep(0.002)


def run_group(service, GoalRequest, kill, prompts, budgets):
    """Start a blocker, queue ``prompts`` behind it; return (blocker result, results).

    The blocker starts on an idle server, so it runs alone and the goals queue behind it.
    """
    # The last result may come before its executor frees: wait for an idle server.
    _poll(lambda: all(e.current is None for e in service.executors), 'an idle server')
    blocker = _submit(service, GoalRequest, kill, BLOCKER, GENEROUS_S, max_new_tokens=BLOCKER_N)
    _poll(lambda: blocker.job is None or blocker.job.started_s is not None,
          'the blocker\'s start')
    goals = [_submit(service, GoalRequest, kill, p, b) for p, b in zip(prompts, budgets)]
    blocker, results = _wait([blocker])[0], _wait(goals)
    if blocker.batch_size != 1:
        raise RuntimeError(f'the blocker ran in a batch of {blocker.batch_size}')
    return blocker, results


def _row(result, prompt_id, factor, mode, budget_s):
    return {'prompt_id': prompt_id, 'factor': factor, 'mode': mode, 'budget_s': budget_s,
            'status': result.status_name, 'deadline_met': bool(result.deadline_met),
            'text': result.response, 'response_tokens': result.response_tokens,
            'alpha': result.eviction_ratio, 'total_s': result.total_time_s,
            'batch_size': result.batch_size, 'message': result.message}


def run(out):
    """Run the benchmark; write DIR/batch_quality.json."""
    from timebill_ros import params
    from timebill_ros.server.factory import build_service
    from timebill_ros.bench.scheduling.workload import load_pool, make_subsets
    from timebill_ros.server import status
    from timebill_ros.server.goals import GoalRequest
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    examples = make_subsets(load_pool(goals=12), goals=12, names=('small',))['small']
    state = pathlib.Path(tempfile.mkdtemp()) / 'batch_quality.online.yaml'  # a fresh state
    config = params.config_from_flat({
        'engine.max_new_tokens': 128, 'scheduler.consolidation': True,
        'scheduler.batch_size': GROUP, 'scheduler.length_ratio': 1000.0,
        'timing.state_file': str(state)})
    service = build_service(config, log=print)
    service.start()
    kill = status.POLICY_KILL
    rows, started = [], time.monotonic()
    try:
        reference = {}
        for e in examples:
            _, (result,) = run_group(service, GoalRequest, kill, [e.prompt], [GENEROUS_S])
            reference[e.prompt_id] = _row(result, e.prompt_id, None, 'reference', GENEROUS_S)
            print(f'reference {e.prompt_id}: {result.response_tokens} tokens, '
                  f'{result.total_time_s:.2f} s', flush=True)
        blocker_s = statistics.median(
            run_group(service, GoalRequest, kill, [], [])[0].total_time_s for _ in range(3))
        for factor in FACTORS:
            for g in range(0, len(examples), GROUP):
                group = examples[g:g + GROUP]
                budgets = [GENEROUS_S if factor == 0 else
                           factor * reference[e.prompt_id]['total_s'] + blocker_s
                           for e in group]
                for e, budget in zip(group, budgets):
                    _, (result,) = run_group(service, GoalRequest, kill, [e.prompt], [budget])
                    rows.append(_row(result, e.prompt_id, factor, 'alone', budget))
                _, results = run_group(service, GoalRequest, kill,
                                       [e.prompt for e in group], budgets)
                for e, budget, result in zip(group, budgets, results):
                    rows.append(_row(result, e.prompt_id, factor, 'batched', budget))
                print(f'f={factor} group {g // GROUP}: alone '
                      f'{[r["status"] for r in rows[-2 * len(group):-len(group)]]}, batched '
                      f'{[(r["status"], r["batch_size"]) for r in rows[-len(group):]]}',
                      flush=True)
    finally:
        service.shutdown()
    data = {'config': {'factors': FACTORS, 'group': GROUP, 'blocker_s': blocker_s,
                       'decode_weights': config.engine.decode_weights,
                       'prompts': len(examples)},
            'reference': reference, 'rows': rows, 'wall_s': time.monotonic() - started}
    (out / 'batch_quality.json').write_text(json.dumps(data, indent=1))
    return data


def _first_difference(tokenizer, a, b):
    """Return the token index where texts ``a`` and ``b`` first differ (len if identical)."""
    x, y = tokenizer.encode(a), tokenizer.encode(b)
    for i, (s, t) in enumerate(zip(x, y)):
        if s != t:
            return i
    return min(len(x), len(y)) if len(x) != len(y) else len(x)


def report(data):
    """Return the markdown table of a run."""
    from rouge_score import rouge_scorer
    from transformers import AutoTokenizer

    from timebill_ros.config import EngineConfig
    from timebill_ros.engine.model_source import resolve_model_dir
    scorer = rouge_scorer.RougeScorer(['rougeL'])
    reference = data['reference']
    lines = ['# Batched vs alone at the same budgets (issue 13, TimeBill side)', '',
             'Command: `timebill study batch_quality --out '
             'benchmarks/results/batch_quality`', '',
             f'{data["config"]["prompts"]} held-out prompts (smallest length variance), '
             f'groups of {data["config"]["group"]}, decode weights '
             f'{data["config"]["decode_weights"]}, Kill, N_max 128; budget = f x the prompt\'s '
             f't_e2e alone + the blocker\'s {data["config"]["blocker_s"]:.2f} s (f = 0: '
             f'{GENEROUS_S:.0f} s); {data["wall_s"] / 60:.1f} min.', '',
             '| f | mode | on time | ROUGE-L (all) | ROUGE-L (on time) | mean alpha | '
             'mean batch size | mean t_e2e s |', '|---|---|---|---|---|---|---|---|']
    for factor in data['config']['factors']:
        for mode in ('alone', 'batched'):
            rows = [r for r in data['rows'] if r['factor'] == factor and r['mode'] == mode]
            if not rows:
                continue
            scores = [scorer.score(reference[r['prompt_id']]['text'], r['text'])['rougeL']
                      .fmeasure if r['text'] else 0.0 for r in rows]
            met = [s for s, r in zip(scores, rows) if r['deadline_met']]
            lines.append('| {} | {} | {}/{} | {:.3f} | {} | {:.3f} | {:.1f} | {:.2f} |'.format(
                'generous' if factor == 0 else f'{factor:.1f}', mode, len(met), len(rows),
                statistics.mean(scores), f'{statistics.mean(met):.3f}' if met else '',
                statistics.mean(r['alpha'] for r in rows),
                statistics.mean(r['batch_size'] for r in rows),
                statistics.mean(r['total_s'] for r in rows)))
    generous = {(r['prompt_id'], r['mode']): r for r in data['rows'] if r['factor'] == 0}
    pairs = [(generous[(p, 'alone')], generous[(p, 'batched')]) for p in reference
             if (p, 'alone') in generous and (p, 'batched') in generous]
    if pairs:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir(EngineConfig()))
        same = sum(a['text'] == b['text'] for a, b in pairs)
        firsts = [_first_difference(tokenizer, a['text'], b['text'])
                  for a, b in pairs if a['text'] != b['text']]
        also = sum(a['text'] == reference[a['prompt_id']]['text'] for a, _ in pairs)
        lines += ['', f'Agreement at the generous budget (alpha* = 0): {same} of {len(pairs)} '
                  'batched answers identical to the same goal alone'
                  + (f'; where they differ, the first differing token is at position '
                     f'{statistics.mean(firsts):.0f} on average (min {min(firsts)})'
                     if firsts else '')
                  + f'. Alone vs the reference run (both alone): {also} of {len(pairs)} '
                  'identical.']
    return '\n'.join(lines) + '\n'


def main():
    """Command line: run (unless --report-only) and write the md."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out', default='benchmarks/results/batch_quality')
    parser.add_argument('--report-only', action='store_true')
    args = parser.parse_args()
    path = pathlib.Path(args.out) / 'batch_quality.json'
    data = json.loads(path.read_text()) if args.report_only else run(args.out)
    text = report(data)
    (pathlib.Path(args.out) / 'batch_quality.md').write_text(text)
    print(text)


if __name__ == '__main__':
    main()
