"""Deadlines on a robot's own model, through the node, with the predictors built for it.

    timebill study own_model_deadlines --model FILE [--out DIR] [--goals N] [--kills N]

Starts ``timebill serve`` on ``engine.model_path: FILE`` (its calibration and its own RLP and
readout from the cache: ``timebill predictor build --model FILE`` first) with a fresh online
state, and sends, from a planner-like client over ROS:

1. **Unseen goals**: the RLP test split of the corpus (prompts no predictor trained on) and
   robot logs of 800-3,000 tokens, ``max_new_tokens`` 256, generous budgets, one after
   another. Per goal: the execution time (total - queue) against the t^_WCET the node
   reported, and N^ against the tokens the answer took. The constant mean is the model's own
   mean training length (capped at N_max as the answers are), on the same goals.
2. **Kill**: goals of phase 1 that ran >= 64 tokens, again, under Kill, with a budget of half
   their phase-1 execution time. The overshoot of a KILLED goal is its total time minus the
   budget, in its own decoding steps (its phase-1 decode time per token after the first).

Writes DIR/<model key>.md and .json; the server log goes to log/. The JSON keeps the rows and
what the figures need besides them (the constant mean, each test prompt's decoding steps in
the collection), so ``--report DIR/<model key>_<tag>.json`` recomputes the .md and the JSON's
summary from that file alone, both from one :func:`summarize` (no node, no model file).
"""

import argparse
import json
import pathlib
import platform
import statistics
import sys
import time

N_MAX = 256
LOG_LINES = (60, 90, 120, 150, 180, 210)
KILL_MIN_TOKENS = 64


def _goals(n_test):
    from timebill_ros import prompts
    from timebill_ros.bench.timebill import rlp_test_prompts
    goals = rlp_test_prompts(n_test)
    logs = [(f'log{n}', prompts.long_prompt(n, seed=9000 + n)) for n in LOG_LINES]
    step = max(1, len(goals) // len(logs))
    for i, log in enumerate(logs):
        goals.insert(min(len(goals), i * (step + 1)), log)
    return goals


def _params(model, state_file, cache_dir='', upper_quantile=None):
    from timebill_ros import params
    from timebill_ros.config import BudgetConfig, EngineConfig, ServerConfig, TimingConfig
    budget = BudgetConfig() if upper_quantile is None else BudgetConfig(
        upper_quantile=upper_quantile)
    config = ServerConfig(engine=EngineConfig(model_path=str(model), max_new_tokens=N_MAX,
                                              model_cache_dir=cache_dir),
                          timing=TimingConfig(state_file=str(state_file)), budget=budget)
    path = pathlib.Path('log') / 'own_model_deadlines_params.yaml'
    path.write_text(params.to_yaml(config))
    return config, str(path)


def _row(name, budget_s, result):
    from timebill_ros.ros.conversions import duration_to_s
    total_s = duration_to_s(result.total_time)
    return {'name': name, 'status': result.status, 'budget_s': budget_s,
            'n_x': result.prompt_tokens, 'n_hat': result.predicted_tokens,
            'n_w': result.pessimistic_tokens, 'n': result.response_tokens,
            'alpha': float(result.eviction_ratio), 'total_s': total_s,
            'exec_s': total_s - duration_to_s(result.queue_time),
            'wcet_s': duration_to_s(result.predicted_wcet),
            'prefill_s': duration_to_s(result.prefill_time),
            'decode_s': duration_to_s(result.decode_time), 'predictor': result.predictor,
            'finish': result.finish_reason, 'message': result.message}


def _run(client, goals, policy, budgets, label):
    from timebill_ros.ros.client import make_goal
    rows = []
    for i, ((name, prompt), budget_s) in enumerate(zip(goals, budgets)):
        result, _ = client.run(make_goal(prompt, budget_s=budget_s, max_new_tokens=N_MAX,
                                         policy=policy), timeout_s=900.0)
        row = _row(name, budget_s, result)
        rows.append(row)
        print(f'{label} [{i + 1}/{len(goals)}] {name:24s} status {row["status"]} '
              f'N_x={row["n_x"]:5d} N^={row["n_hat"]:3d} N={row["n"]:3d} exec '
              f'{row["exec_s"]:6.2f} s WCET {row["wcet_s"]:6.2f} s', flush=True)
    return rows


def summarize(unseen, kills, constant_tokens, steps=None):
    """Return the figures of both phases (COMPLETED unseen goals; KILLED kill goals).

    steps: prompt id -> the decoding steps its answer took in the collection (the predictors'
    label: where the loop guard fired, before it cut the repeated tail), capped at N_MAX here;
    the node's ``response_tokens`` count the answer after the cut. None: no such comparison.
    """
    from timebill_ros.server.status import COMPLETED, KILLED
    done = [r for r in unseen if r['status'] == COMPLETED]
    covered = [r for r in done if r['exec_s'] <= r['wcet_s']]  # the run: what t^_WCET bounds
    covered_queue = [r for r in done if r['total_s'] <= r['wcet_s']]  # the queue wait included
    mae = statistics.mean(abs(r['n_hat'] - r['n']) for r in done)
    constant = statistics.mean(abs(min(constant_tokens, N_MAX) - r['n']) for r in done)
    labelled = [r for r in done if steps and r['name'] in steps]
    by_steps = ({'labelled': len(labelled),
                 'n_hat_mae_steps': statistics.mean(
                     abs(r['n_hat'] - min(steps[r['name']], N_MAX)) for r in labelled),
                 'constant_mae_steps': statistics.mean(
                     abs(min(constant_tokens, N_MAX) - min(steps[r['name']], N_MAX))
                     for r in labelled)} if labelled else {})
    killed = [r for r in kills if r['status'] == KILLED]
    # A goal's step: its unseen run's decode time per token after the first (which comes
    # from the prefill's logits), on the same prompt and cache length.
    step_s = {r['name']: r['decode_s'] / (r['n'] - 1) for r in unseen if r['n'] >= 2}
    steps = [max(0.0, r['total_s'] - r['budget_s']) / step_s[r['name']]
             for r in killed if r['name'] in step_s]
    return {'unseen': len(unseen), 'completed': len(done), 'covered': len(covered),
            'coverage': len(covered) / len(done), 'covered_with_queue': len(covered_queue),
            'coverage_with_queue': len(covered_queue) / len(done),
            'n_hat_mae': mae, 'constant_mae': constant,
            'mae_ratio': mae / constant, 'constant_tokens': constant_tokens,
            'predictors': sorted({r['predictor'] for r in unseen}),
            'kill_goals': len(kills), 'killed': len(killed),
            'kill_statuses': sorted({r['status'] for r in kills}),
            'overshoot_steps_max': max(steps) if steps else None,
            'overshoot_steps_p50': statistics.median(steps) if steps else None,
            'overshoot_ms_max': max(max(0.0, r['total_s'] - r['budget_s']) * 1e3
                                    for r in killed) if killed else None, **by_steps}


def _report(key, summary, saved, json_path):
    """Return the .md of a run: ``summary`` of ``saved`` (the JSON at ``json_path``)."""
    s = summary
    overshoot = ('-' if s['overshoot_steps_max'] is None else
                 f"max {s['overshoot_steps_max']:.2f} steps ({s['overshoot_ms_max']:.0f} ms), "
                 f"median {s['overshoot_steps_p50']:.2f}")
    where = (f"host {saved['host']}, {saved['date']}" if 'date' in saved else
             'host and date: not kept in the JSON')
    steps_row = ([f"| against the decoding steps each answer took in the collection (before the "
                  f"loop guard's cut; {s['labelled']} test prompts): N^ MAE / constant MAE | "
                  f"{s['n_hat_mae_steps']:.1f} / {s['constant_mae_steps']:.1f} = "
                  f"{s['n_hat_mae_steps'] / s['constant_mae_steps']:.0%} |"]
                 if 'labelled' in s else
                 ['| against the decoding steps each answer took in the collection | not '
                  "recomputable: the JSON does not keep the collection's steps |"])
    return '\n'.join([
        f'# Deadlines on {key}, through the node', '',
        f"Command: `{saved['command']}`; {where}.", '',
        f'Recompute: `timebill study own_model_deadlines --report {json_path}` (reads only '
        'that JSON: its rows and the constant mean; rewrites this file and its summary).', '',
        '| figure | value |', '|---|---|',
        f"| unseen goals (test split + robot logs), COMPLETED | {s['completed']} of "
        f"{s['unseen']} |",
        f"| t^_WCET covers the execution time (total - queue: the run, what it bounds) | "
        f"{s['covered']} of {s['completed']} ({s['coverage']:.1%}) |",
        f"| t^_WCET covers the total time (the queue wait included) | "
        f"{s['covered_with_queue']} of {s['completed']} ({s['coverage_with_queue']:.1%}) |",
        f"| N^ MAE (tokens) | {s['n_hat_mae']:.1f} |",
        f"| constant mean MAE (tokens; mean {s['constant_tokens']:.1f} capped at {N_MAX}) | "
        f"{s['constant_mae']:.1f} |",
        f"| N^ MAE / constant mean MAE | {s['mae_ratio']:.0%} |",
        *steps_row,
        f"| Kill goals (half their unseen execution time) KILLED | {s['killed']} of "
        f"{s['kill_goals']} |",
        f'| Kill overshoot (total - budget) | {overshoot} |',
        f"| predictor named in results | {', '.join(s['predictors'])} |"]) + '\n'


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--model', help='the .gguf file (required but with --report)')
    parser.add_argument('--out', default='benchmarks/results/own_predictor')
    parser.add_argument('--goals', type=int, default=10_000, help='at most N test prompts')
    parser.add_argument('--kills', type=int, default=30, help='at most N Kill goals')
    parser.add_argument('--cache', default='', help='engine.model_cache_dir (default: the '
                        'user cache)')
    parser.add_argument('--upper-quantile', type=float, default=None,
                        help='budget.upper_quantile (default: the parameter\'s default)')
    parser.add_argument('--tag', default='deadlines', help='output name: <model key>_<tag>')
    parser.add_argument('--report', metavar='JSON', default='',
                        help="rewrite a run's .md and its JSON's summary from that JSON alone "
                        '(no node, no model file)')
    args = parser.parse_args(argv)
    if args.report:
        return rewrite(pathlib.Path(args.report))
    if not args.model:
        parser.error('--model is required (or --report JSON)')
    from timebill_ros.bench.server_process import served
    from timebill_ros.cli.predictor_build import lengths_path
    from timebill_ros.engine import model_source
    from timebill_ros.server.status import POLICY_KILL
    from timebill_ros.training.dataset import load_examples
    pathlib.Path('log').mkdir(exist_ok=True)
    state_file = pathlib.Path('log') / 'own_model_deadlines.online.yaml'
    state_file.unlink(missing_ok=True)
    config, params_file = _params(pathlib.Path(args.model).resolve(), state_file,
                                  args.cache, args.upper_quantile)
    key = model_source.model_key(config.engine)
    splits = load_examples(lengths_path(config))
    constant_tokens = statistics.mean(e.n_tokens for e in splits['train'])
    steps = {e.prompt_id: e.n_tokens for e in splits['test']}
    out = pathlib.Path(args.out)
    goals = _goals(args.goals)
    with served(params_file, pathlib.Path('log') / 'own_model_deadlines_server.log',
                wait_s=1800.0) as client:
        unseen = _run(client, goals, POLICY_KILL, [600.0] * len(goals), 'unseen')
        long = [(g, r) for g, r in zip(goals, unseen) if r['n'] >= KILL_MIN_TOKENS]
        long = long[:args.kills]
        kills = _run(client, [g for g, _ in long], POLICY_KILL,
                     [round(r['exec_s'] / 2, 3) for _, r in long], 'kill')
    out.mkdir(parents=True, exist_ok=True)
    saved = {'command': 'timebill study own_model_deadlines ' + ' '.join(sys.argv[1:]),
             'key': key, 'host': f'{platform.node()} ({platform.machine()})',
             'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
             'constant_tokens': constant_tokens,
             'steps': {name: n for name, n in steps.items()
                       if name in {r['name'] for r in unseen}},
             'unseen': unseen, 'kills': kills}
    return rewrite(out / f'{key}_{args.tag}.json', saved)


def _tag(command):
    """Return the --tag of a run's command line (its files' names end with it)."""
    words = command.split()
    return words[words.index('--tag') + 1] if '--tag' in words[:-1] else 'deadlines'


def rewrite(json_path, saved=None):
    """Write the .md and the JSON (rows, inputs and the summary) of a run from one summary.

    saved: the run (None: read ``json_path``). Its ``constant_tokens`` and ``steps`` are
    what the figures need besides the rows; a JSON written before they were kept has the
    constant in its old summary and no steps (the steps row then says it cannot be rebuilt).
    """
    json_path = pathlib.Path(json_path)
    if saved is None:
        saved = json.loads(json_path.read_text())
    saved.setdefault('constant_tokens', saved.get('summary', {}).get('constant_tokens'))
    tag = '_' + _tag(saved['command'])
    key = saved.get('key') or (json_path.stem[:-len(tag)] if json_path.stem.endswith(tag)
                               else json_path.stem)
    summary = summarize(saved['unseen'], saved['kills'], saved['constant_tokens'],
                        saved.get('steps'))
    text = _report(key, summary, saved, json_path)
    rows = {name: saved[name] for name in ('unseen', 'kills')}
    head = {name: value for name, value in saved.items()
            if name not in ('summary', 'unseen', 'kills')}
    json_path.with_suffix('.md').write_text(text)
    json_path.write_text(json.dumps({**head, 'summary': summary, **rows}, indent=1))
    print(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
