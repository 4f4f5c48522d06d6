"""``timebill bench --workload robot-context``: TimeBill's Fig. 7 and Fig. 8 on robot contexts.

The workload (bench/robot_context.py): follow-up questions over long robot contexts, the
contexts warm in every server's prefix store, so decoding over a long KV dominates. Protocol:

1. A fresh start-up calibration (shared by every server, as ``timebill bench``), one server per
   method (``timebill serve``; Vanilla, alpha = 0.25 / 0.5 / 0.75 / 0.95, TimeBill with the
   server's defaults), each with a prefix store large enough for every context.
2. Every context is prefilled once on every server (a one-token goal), so that it is warm.
3. The Vanilla pass: every item on the Vanilla server with a generous budget. Its answer is the
   item's full-cache reference and its measured time t_v the item's Vanilla time. Items whose
   answer is shorter than MIN_ANSWER_TOKENS are left out (a question the model answers in a
   few words does not exercise decoding); ``--items N`` keeps N, as evenly over the contexts
   as they allow.
4. For each policy (Kill, Skip-Next) and context, the context's items run once more on the
   Vanilla server with no deadline: that t_v, measured minutes before the runs that use it
   (the machine drifts over an hour), is the budgets' (rows keep it as ``vanilla_s``; runs
   whose rows lack it took the pass's). Then for each budget fraction f: every method in
   turn (the order rotated from run to run, so the drift within a context hits all alike)
   runs that context's items at budgets T = f t_v. Kill: one goal after another.
   Skip-Next: released as a periodic stream, each job's deadline the next one's release (an
   overrun makes the next jobs come due; they end SKIPPED), as TimeBill's Sec. 6.4; when the
   server has finished every job before the next release, the schedule moves up (idle time
   elided).
5. Scores (bench/scores.py): ROUGE-L F1 against the full-cache answer and, where the item has
   one, against its own reference; 0 for a Kill miss and for a skipped job; completion rate
   and mean score per method and budget with bootstrap 95 % intervals over items.

``--k-sweep``: Fig. 8 instead: TimeBill at pessimistic factors k = 1..8 at one budget fraction
(``--k-fraction``) under Kill, beside Vanilla's references.

Writes ``robot_bench.md`` (tables), ``robot_bench.png`` (Fig. 7 as the paper draws it: score and
completion rate against the budget, one line per method, Kill and Skip-Next side by side) and
``robot_bench_raw.json`` (every job) under ``--out``.
"""

import collections
import contextlib
import functools
import json
import pathlib
import tempfile
import time

import numpy as np

from timebill_ros.bench import scores
from timebill_ros.bench.robot_context import KINDS, build_workload
from timebill_ros.bench.rows import pick, result_fields
from timebill_ros.bench.server_process import rotate, start_servers
from timebill_ros.bench.timebill import METHODS as PROMPT_METHODS
from timebill_ros.bench.timebill import _rouge_l_scorer, _stream, fresh_calibration, server_flat
from timebill_ros.server.status import POLICY_KILL, POLICY_SKIP_NEXT, REJECTED

FRACTIONS = (0.3, 0.45, 0.6, 0.75, 0.95, 1.25)
# Fig. 7's methods: those of the prompt benchmark, TimeBill with the server's defaults only.
FIG7 = ('vanilla', 'alpha=0.25', 'alpha=0.5', 'alpha=0.75', 'alpha=0.95', 'timebill',
        'timebill-online')
# Named with --methods only: timebill-online with the decode readout off / on.
EXTRA = ('timebill-online-prefill', 'timebill-online-decode')
METHODS = tuple(m for m in PROMPT_METHODS if m[0] in FIG7 + EXTRA)
POLICIES = (('kill', POLICY_KILL), ('skip_next', POLICY_SKIP_NEXT))
# 256 (the second run) put the protocol at ~125 min here, 37 of its 60 answers running to
# N_max (the model rarely stops on its own); at 128 the answers are 64-128 tokens.
N_MAX = 128
MIN_ANSWER_TOKENS = 64
CONTEXT_SIZES = (1200, 2200, 3200)
PREFIX_MB = 2400.0  # every context of the workload (~45 KiB a token here) and room to spare
# Every server prefills in fp32. The bf16 prefill (engine.prefill_dtype auto here) rounds each
# GEMM's output to bf16, so a prompt's logits depend on how its prefill was cut into chunks,
# and each server cuts by its own time model: the third run's TimeBill gave 10 of its 54
# whole-cache answers unlike the Vanilla server's, which scored them as losses of eviction
# (docs/benchmark.md). In fp32 the chunk plans of two servers left the logits within 5e-5 and
# the answer equal; the prefills here are the ~50-token questions after a cached context.
PREFILL_DTYPE = 'float32'
# The k sweep's servers start this many at a time (eight with a full prefix store each do not
# fit a 23 GB machine); the methods of one group are interleaved per item, groups in turn.
K_SWEEP_GROUP = 4
WARM_QUESTION = 'Reply with OK.'
K_SWEEP = (1, 2, 3, 4, 5, 6, 7, 8)
# The paper's N^_W = min(k N^, N_max): the server's default takes the predictor's upper
# quantile instead (budget.upper_quantile 0.9), where k plays no part.
K_SWEEP_BOUND = {'budget.upper_quantile': 0.0}
RESULT_COLUMNS = ('prompt_tokens', 'predicted_tokens', 'pessimistic_tokens', 'response_tokens',
                  'predicted_wcet_s', 'deadline_met', 'truncated', 'message', 'prefill_s',
                  'decode_s', 'total_s', 'queue_s', 'predictor', 'checkpoint_tokens',
                  'checkpoint_ratios', 'checkpoint_wcet_s', 'rest_error_tokens')


def select_items(items, vanilla, n_items=0, min_tokens=MIN_ANSWER_TOKENS):
    """Return the items to run: those whose Vanilla answer has >= ``min_tokens`` tokens.

    vanilla: {item_id: {'tokens': ..., ...}}; n_items > 0 keeps that many, taken round-robin
    over the contexts (each context's items in order) so that every context is represented.
    """
    kept = [item for item in items if vanilla[item.item_id]['tokens'] >= min_tokens]
    if n_items <= 0 or n_items >= len(kept):
        return kept
    by_context = {}
    for item in kept:
        by_context.setdefault(item.context_id, []).append(item)
    chosen, rank = [], 0
    while len(chosen) < n_items:
        chosen += [group[rank] for group in by_context.values() if len(group) > rank]
        rank += 1
    chosen = set(item.item_id for item in chosen[:n_items])
    return [item for item in kept if item.item_id in chosen]


def selection_text(vanilla, kept, min_tokens=MIN_ANSWER_TOKENS):
    """Return how the kept items were chosen: all, short (left out), cut by --items, kept."""
    short = sum(answer['tokens'] < min_tokens for answer in vanilla.values())
    capped = len(vanilla) - short - len(kept)
    return (f'{len(kept)} of {len(vanilla)} items kept: {short} answered in fewer than '
            f'{min_tokens} tokens left out, {capped} more cut by --items')


def runs(items, fractions, policies, methods):
    """Return the runs in order: [(policy, context_id, fraction, [method order], items)].

    Each (policy, context, fraction) is played on every method, the method order rotated by
    one from each run to the next.
    """
    by_context = {}
    for item in items:
        by_context.setdefault(item.context_id, []).append(item)
    out, turn = [], 0
    for policy in policies:
        for context_id, group in by_context.items():
            for fraction in fractions:
                out.append((policy, context_id, fraction, rotate(methods, turn), group))
                turn += 1
    return out


def _goal(item, budget_s, policy_code, n_max):
    from timebill_ros.ros.client import make_goal
    return make_goal(item.prompt, budget_s=budget_s, max_new_tokens=n_max, policy=policy_code)


def _play(client, items, budgets, policy, policy_code, n_max):
    """Run ``items`` at ``budgets`` on one server; return their results in order."""
    if policy == 'kill':  # one goal after another
        return [client.run(_goal(item, budget, policy_code, n_max))[0]
                for item, budget in zip(items, budgets)]
    # A periodic stream, as the prompt benchmark's: each deadline the next one's release.
    # Its idle gaps elided: the busy time is the same, the run ~15 min shorter.
    return _stream(client, [(item.item_id, item.prompt, budget)
                            for item, budget in zip(items, budgets)], policy_code, n_max,
                   elide_idle=True)


def _row(method, policy, fraction, item, budget_s, result):
    fields = result_fields(result)
    return {'method': method, 'policy': policy, 'fraction': fraction, 'item': item.item_id,
            'context': item.context_id, 'budget_s': budget_s, 'status': fields['status'],
            'response': fields['response'], 'alpha': fields['eviction_ratio'],
            'decided': fields['predicted_wcet_s'] > 0,
            'cached_tokens': int(getattr(result, 'cached_tokens', 0)),
            **pick(fields, RESULT_COLUMNS)}


def warm_contexts(clients, items, n_max, progress=print):
    """Prefill every context once on every server (a one-token goal with a long budget)."""
    from timebill_ros.ros.client import make_goal
    contexts = {}
    for item in items:
        contexts.setdefault(item.context_id, item.context)
    for name, client in clients:
        for context_id, context in contexts.items():
            result, _ = client.run(make_goal(f'{context}\n\n{WARM_QUESTION}', budget_s=600.0,
                                             max_new_tokens=1))
            progress(f'  warmed {context_id} on {name}: status {result.status}')


def vanilla_pass(client, items, n_max, progress=print):
    """Return {item_id: {'response', 'tokens', 'seconds', 'cached'}} of the Vanilla server."""
    out = {}
    for item in items:
        result, _ = client.run(_goal(item, 600.0, POLICY_KILL, n_max))
        fields = result_fields(result)
        out[item.item_id] = {'response': fields['response'],
                             'tokens': fields['response_tokens'], 'seconds': fields['total_s'],
                             'cached': int(getattr(result, 'cached_tokens', 0))}
        progress(f"  vanilla {item.item_id}: {fields['response_tokens']} tokens in "
                 f"{fields['total_s']:.2f} s (cached {out[item.item_id]['cached']})")
    return out


def retime_vanilla(client, group, vanilla, n_max, progress=print):
    """Return {item_id: seconds} of ``group`` run again on the Vanilla server, no deadline.

    The budgets of a context's runs are fractions of this t_v, measured minutes before them,
    not of the Vanilla pass's, measured up to an hour earlier: the machine drifts
    (benchmarks/results/robot_context_gemma/README.md). The answer stays the pass's
    (greedy: the same text; a different one is reported).
    """
    again = vanilla_pass(client, group, n_max, progress)
    seconds = {item_id: answer['seconds'] for item_id, answer in again.items()}
    for item_id, answer in again.items():
        if answer['response'] != vanilla[item_id]['response']:
            progress(f'  re-timed {item_id}: the answer differs from the Vanilla pass')
    ratio = sum(seconds.values()) / max(1e-9, sum(vanilla[i]['seconds'] for i in seconds))
    progress(f'  re-timed Vanilla on {group[0].context_id}: {ratio:.2f} x the pass')
    return seconds


def play_all(clients, items, vanilla, fractions, policies, n_max, progress=print,
             rows_path=None, retime=True):
    """Run every (policy, context, fraction) on every method; return one row per job.

    Each (policy, context)'s budgets are fractions of its items' Vanilla time re-measured
    just before its first run (:func:`retime_vanilla`) where ``retime`` and a Vanilla server
    runs, else of the pass's; each row keeps its t_v (``vanilla_s``). rows_path: a
    JSON-lines file each method's rows of a run are appended to as they come, so that a
    stopped run keeps what it ran.
    """
    by_name = dict(clients)
    rows, t_v = [], {}
    for policy, context_id, fraction, order, group in runs(items, fractions, policies,
                                                           [name for name, _ in clients]):
        code = dict(POLICIES)[policy]
        if (policy, context_id) not in t_v:
            t_v[(policy, context_id)] = (
                retime_vanilla(by_name['vanilla'], group, vanilla, n_max, progress)
                if retime and 'vanilla' in by_name else
                {item.item_id: vanilla[item.item_id]['seconds'] for item in group})
        seconds = t_v[(policy, context_id)]
        budgets = [round(fraction * seconds[item.item_id], 3) for item in group]
        for name in order:
            results = _play(by_name[name], group, budgets, policy, code, n_max)
            new = [dict(_row(name, policy, fraction, item, budget, result),
                        vanilla_s=seconds[item.item_id])
                   for item, budget, result in zip(group, budgets, results)]
            rows += new
            if rows_path is not None:
                with open(rows_path, 'a', encoding='utf-8') as stream:
                    stream.writelines(json.dumps(row) + '\n' for row in new)
            done = sum(scores.completed(row) for row in rows[-len(group):])
            progress(f'  {policy:9s} {context_id:18s} f={fraction:.2f} {name:11s} '
                     f'{done}/{len(group)} completed')
    return rows


def timebill_diagnostics(rows, vanilla):
    """Return one line per (policy, fraction, TimeBill method): its decisions and their errors.

    rows: the run's jobs (:func:`_row`); vanilla: {item: {'tokens', 'seconds'}}. A line holds
    n (jobs decided: t^_WCET made), evicted (share with alpha* > 0), mean_alpha, the
    predictor in use, n_ratio (median N^ / N_v), n_mae (mean |N^ - N_v|, tokens),
    wcet_ratio (median t^_WCET / t_v), coverage (completed jobs whose run, total - queue,
    stayed within t^_WCET, which bounds the run; None without one, or when the rows lack
    queue_s), coverage_with_queue (the same against the whole total, the queue wait included)
    and refused (share of all its jobs REJECTED: infeasible, the model not run).
    """
    groups = {}
    for row in rows:
        if row['method'].startswith('timebill'):
            groups.setdefault((row['policy'], row['fraction'], row['method']), []).append(row)
    out = []
    for (policy, fraction, method), jobs in sorted(groups.items()):
        group = [row for row in jobs if row.get('decided')]
        if not group:
            continue
        truth = [vanilla[row['item']] for row in group]
        done = [row for row in group if scores.completed(row)]
        out.append({
            'policy': policy, 'fraction': fraction, 'method': method, 'n': len(group),
            'evicted': float(np.mean([row['alpha'] > 0 for row in group])),
            'mean_alpha': float(np.mean([row['alpha'] for row in group])),
            'predictor': collections.Counter(
                str(row.get('predictor', '')).split(' ')[0] for row in group).most_common(1)[0][0],
            'n_ratio': float(np.median([row['predicted_tokens'] / max(t['tokens'], 1)
                                        for row, t in zip(group, truth)])),
            'n_mae': float(np.mean([abs(row['predicted_tokens'] - t['tokens'])
                                    for row, t in zip(group, truth)])),
            'wcet_ratio': float(np.median([
                row['predicted_wcet_s'] / max(row.get('vanilla_s', t['seconds']), 1e-9)
                for row, t in zip(group, truth)])),
            'coverage': (float(np.mean([row['predicted_wcet_s'] >= row['total_s']
                                        - row['queue_s'] for row in done]))
                         if done and all('queue_s' in row for row in done) else None),
            'coverage_with_queue': (float(np.mean([row['predicted_wcet_s'] >= row['total_s']
                                                   for row in done])) if done else None),
            'refused': float(np.mean([row['status'] == REJECTED for row in jobs]))})
    return out


def vanilla_drift(rows, vanilla):
    """Return one dict per (policy, fraction): Vanilla's jobs against the t_v of their budgets.

    rows: the run's jobs (:func:`_row`, ``vanilla_s`` where re-timed); vanilla: the pass,
    {item: {'seconds'}}. A dict holds n (Vanilla jobs), completed, run_ratio (median of each
    job's run, total - queue seconds, over its t_v: a killed job counts at its kill, so above
    1.0 at a fraction < 1 the median is a lower bound) and retime_ratio (median t_v over the
    pass's seconds for the item: 1.0 where the run kept the pass's t_v). A run_ratio above 1.0
    means the machine ran slower than when t_v was measured: every budget was tighter than
    its fraction says, for every method alike.
    """
    groups = {}
    for row in rows:
        if row['method'] == 'vanilla':
            groups.setdefault((row['policy'], row['fraction']), []).append(row)
    out = []
    for (policy, fraction), jobs in sorted(groups.items()):
        t_v = [row.get('vanilla_s', vanilla[row['item']]['seconds']) for row in jobs]
        out.append({
            'policy': policy, 'fraction': fraction, 'n': len(jobs),
            'completed': sum(scores.completed(row) for row in jobs),
            'run_ratio': float(np.median([(row['total_s'] - row.get('queue_s', 0.0))
                                          / max(t, 1e-9) for row, t in zip(jobs, t_v)])),
            'retime_ratio': float(np.median([
                t / max(vanilla[row['item']]['seconds'], 1e-9) for row, t in zip(jobs, t_v)]))})
    return out


def drift_lines(drift):
    """Return the Markdown section of :func:`vanilla_drift` (empty without Vanilla rows)."""
    if not drift:
        return []
    return ['', '### Vanilla against the t_v of its budgets (the machine\'s drift)', '',
            'run / t_v: median of each Vanilla job\'s run (total - queue) over its t_v; a '
            'killed job counts at its kill. t_v / pass: median of the t_v the budgets came '
            'from over the Vanilla pass\'s seconds (1.00: not re-timed).', '',
            '| policy | T / t_v | Vanilla jobs | completed | median run / t_v | '
            'median t_v / pass |', '|---|---|---|---|---|---|'] + [
        f"| {d['policy']} | {d['fraction']:.2f} | {d['n']} | {d['completed']} | "
        f"{d['run_ratio']:.2f} | {d['retime_ratio']:.2f} |" for d in drift]


def diagnostics_lines(lines):
    """Return Markdown table lines of :func:`timebill_diagnostics`."""
    out = ['| policy | T / t_v | method | jobs decided | refused | evicted | mean alpha* | '
           'predictor | median N^ / N_v | MAE N^ (tokens) | median t^_WCET / t_v | coverage '
           '(run) | coverage (queue included) |',
           '|---|---|---|---|---|---|---|---|---|---|---|---|---|']
    for d in lines:
        coverage = ' | '.join('-' if d[key] is None else f'{d[key]:.2f}'
                              for key in ('coverage', 'coverage_with_queue'))
        out.append(f"| {d['policy']} | {d['fraction']:.2f} | {d['method']} | {d['n']} | "
                   f"{d['refused']:.2f} | {d['evicted']:.2f} | {d['mean_alpha']:.2f} | "
                   f"{d['predictor']} | "
                   f"{d['n_ratio']:.2f} | {d['n_mae']:.1f} | {d['wcet_ratio']:.2f} | "
                   f"{coverage} |")
    return out


def _fmt(interval):
    mean, low, high = interval
    return f'{mean:.3f} [{low:.3f}, {high:.3f}]'


def report_lines(lines, title):
    """Return Markdown table lines of :func:`scores.summarize`'s lines."""
    out = [f'### {title}', '',
           '| policy | T / t_v | method | completion [95 % CI] | ROUGE-L [95 % CI] | '
           'ROUGE-L of a completed job | task score | mean alpha* |',
           '|---|---|---|---|---|---|---|---|']
    for line in lines:
        task, each = line.get('task_score'), line.get('per_completed')
        out.append(f"| {line['policy']} | {line['fraction']:.2f} | {line['method']} | "
                   f"{_fmt(line['completion'])} | {_fmt(line['score'])} | "
                   f"{'-' if each is None else f'{each:.3f}'} | "
                   f"{'-' if task is None else f'{task:.3f}'} | {line['mean_alpha']:.2f} |")
    return out


def plot_k(lines, path):
    """Fig. 8 as the paper draws it: score and completion against k, at one budget."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    pts = sorted((float(line['method'].rsplit('-k', 1)[1]), line['score'], line['completion'])
                 for line in lines if '-k' in line['method'])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, index, title in ((axes[0], 1, 'ROUGE-L vs full-cache answer'),
                             (axes[1], 2, 'completion rate')):
        ax.errorbar([p[0] for p in pts], [p[index][0] for p in pts],
                    yerr=[[p[index][0] - p[index][1] for p in pts],
                          [p[index][2] - p[index][0] for p in pts]], marker='o', capsize=3)
        ax.set_xlabel('pessimistic factor k')
        ax.set_title(f"{title}, Kill, T = {lines[0]['fraction']:.2f} t_v")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot(lines, path, methods):
    """Fig. 7 as the paper draws it: score and completion against the budget fraction."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    policies = sorted({line['policy'] for line in lines})
    fig, axes = plt.subplots(2, len(policies), figsize=(5.5 * len(policies), 7), sharex=True,
                             squeeze=False)
    for col, policy in enumerate(policies):
        for method in methods:
            pts = sorted((line['fraction'], line['score'], line['completion'])
                         for line in lines if line['method'] == method
                         and line['policy'] == policy)
            if not pts:
                continue
            xs = [p[0] for p in pts]
            for row, index in ((0, 1), (1, 2)):
                axes[row][col].errorbar(
                    xs, [p[index][0] for p in pts],
                    yerr=[[p[index][0] - p[index][1] for p in pts],
                          [p[index][2] - p[index][0] for p in pts]],
                    marker='o', capsize=3, label=method)
        axes[0][col].set_title(f'{policy}: ROUGE-L vs full-cache answer')
        axes[1][col].set_title(f'{policy}: completion rate')
        axes[1][col].set_xlabel('budget T / vanilla time t_v')
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _method_servers(args):
    """Return [(name, flat parameters)] of the run's servers (vanilla first)."""
    extra = {'prefix_cache.max_mb': PREFIX_MB, 'engine.prefill_dtype': PREFILL_DTYPE,
             'engine.model_path': getattr(args, 'model', '') or ''}
    if args.k_sweep:
        timebill = next(m for m in METHODS if m[0] == 'timebill')
        vanilla = [] if getattr(args, 'vanilla', None) else [
            ('vanilla', {**server_flat(METHODS[0]), **extra})]
        return vanilla + [
            (f'timebill-k{k}', {**server_flat(timebill), **extra, **K_SWEEP_BOUND,
                                'budget.pessimistic_factor': float(k)}) for k in K_SWEEP]
    wanted = set(args.methods.split(',')) if args.methods else set(FIG7)
    unknown = sorted(wanted - {m[0] for m in METHODS})
    if unknown:
        raise ValueError(f'unknown method(s) {unknown}; known: {[m[0] for m in METHODS]}')
    return [(m[0], {**server_flat(m), **extra}) for m in METHODS
            if m[0] in wanted or m[0] == 'vanilla']


def _served_config(model_path):
    """Return the ServerConfig whose model the run serves (its predictor files count)."""
    from timebill_ros.config import EngineConfig, ServerConfig
    return ServerConfig(engine=EngineConfig(model_path=model_path))


def require_predictor(methods, config=None):
    """Raise FileNotFoundError when a TimeBill method would run without its trained RLP.

    methods: [(name, flat parameters)]. The server falls back to N^ = N_max without the RLP
    (and says so only in its log): a run measured so is not TimeBill's (the first Kill run
    was, 2026-11-27). config: the ServerConfig whose predictor files count (None: the
    defaults, as the benchmark's servers run).
    """
    from timebill_ros.config import ServerConfig
    from timebill_ros.predictors.contract import predictor_files
    if not any(flat.get('predictor.kind') == 'rlp' for _, flat in methods):
        return
    path = predictor_files(config or ServerConfig())['RLP']
    if not path.exists():
        raise FileNotFoundError(f'TimeBill needs its trained predictor, none at {path}: '
                                'build it first with `make predictor` (another file: '
                                '`timebill predictor build --model FILE.gguf`)')


def _play_groups(methods, group, calibration, items, vanilla, plan, stem_path, mark, log):
    """Start the servers ``group`` at a time, play every run on each; return what they made.

    methods: [(name, flat parameters)], Vanilla first where ``vanilla`` (a given pass,
    {item_id: ...}) is None. plan: {'n_items', 'fractions', 'policies'}. stem_path: the
    output files' path without suffix (``_vanilla.json``, ``_rows.jsonl`` are added).
    mark(phase): notes the minutes a phase ('setup_min', 'vanilla_min') took.
    Returns (vanilla pass, kept items, rows).
    """
    rows, chosen = [], None
    rows_path = stem_path.with_name(stem_path.name + '_rows.jsonl')
    for first in range(0, len(methods), group):
        with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as servers:
            clients = start_servers(servers, methods[first:first + group], calibration, tmp,
                                    N_MAX, tmp, 'timebill_robot', log)
            # With a Vanilla pass done (or given) only the kept items' contexts need to be warm.
            warm_contexts(clients, items if vanilla is None else select_items(
                items, vanilla, plan['n_items']), N_MAX, log)
            if vanilla is None:
                mark('setup_min')
                vanilla = vanilla_pass(dict(clients)['vanilla'], items, N_MAX, log)
                stem_path.with_name(stem_path.name + '_vanilla.json').write_text(
                    json.dumps(vanilla, indent=1), encoding='utf-8')
                mark('vanilla_min')
            chosen = select_items(items, vanilla, plan['n_items'])
            log(selection_text(vanilla, chosen))
            # Servers started in groups (the k sweep) share the pass's t_v: only the first
            # group has a Vanilla server to re-time with.
            rows += play_all(clients, chosen, vanilla, plan['fractions'], plan['policies'],
                             N_MAX, log, rows_path, retime=group >= len(methods))
    return vanilla, chosen, rows


def run_robot_bench(args):
    """Run the robot-context benchmark (module docstring); write its files under args.out."""
    from timebill_ros.timing.profiler import format_report
    if args.report:
        return report_from(args.report)
    model_path = getattr(args, 'model', '') or ''
    require_predictor(_method_servers(args), _served_config(model_path))
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    engine, calibration = fresh_calibration(N_MAX, PREFILL_DTYPE, model_path)
    model_key = engine.model_key
    quick = {'kinds': KINDS[:2], 'sizes': CONTEXT_SIZES[:1]} if args.quick else {}
    items = build_workload(lambda text: len(engine.encode(text)),
                           **{'sizes': CONTEXT_SIZES, **quick})
    engine = None  # the servers load their own
    fractions = (args.k_fraction,) if args.k_sweep else (
        tuple(float(f) for f in args.fractions.split(',')) if args.fractions else FRACTIONS)
    policies = ['kill'] if args.k_sweep else [p for p in args.policies.split(',')]
    unknown = sorted(set(policies) - set(dict(POLICIES)))
    if unknown:
        raise ValueError(f'unknown policies {unknown}; known: {list(dict(POLICIES))}')
    stem = 'robot_bench_k' if args.k_sweep else 'robot_bench'
    (out_dir / f'{stem}_rows.jsonl').unlink(missing_ok=True)
    log = functools.partial(print, flush=True)
    given = json.loads(pathlib.Path(args.vanilla).read_text(encoding='utf-8')) if getattr(
        args, 'vanilla', None) else None
    methods = _method_servers(args)
    phases = {}
    vanilla, chosen, rows = _play_groups(
        methods, K_SWEEP_GROUP if args.k_sweep else len(methods), calibration, items, given,
        dict(n_items=args.items, fractions=fractions, policies=policies), out_dir / stem,
        lambda name: phases.setdefault(name, (time.monotonic() - started) / 60
                                       - sum(phases.values())), log)
    minutes = (time.monotonic() - started) / 60
    raw = {'rows': rows, 'vanilla': vanilla, 'items': [i.item_id for i in chosen],
           'references': {i.item_id: i.reference for i in chosen if i.reference},
           'methods': [name for name, _ in methods], 'minutes': minutes,
           'phases': phases, 'calibration': format_report(calibration), 'model': model_key}
    (out_dir / f'{stem}_raw.json').write_text(json.dumps(raw, indent=1), encoding='utf-8')
    return write_report(raw, out_dir, stem)


def score_lines(raw, similarity):
    """Return (scores.summarize's lines, ['<policy> <items>', ...]) of a run's raw rows."""
    vanilla = raw['vanilla']
    refs = {item: vanilla[item]['response'] for item in raw['items']}
    lines, counts = [], []
    for policy in sorted({row['policy'] for row in raw['rows']}):
        # Each policy is scored over the items it ran (a stopped run: fewer under the last).
        rows = [row for row in raw['rows'] if row['policy'] == policy]
        lines += scores.summarize(rows, refs, similarity, raw.get('references'))
        counts.append(f"{policy} {len({row['item'] for row in rows})}")
    return lines, counts


def write_report(raw, out_dir, stem):
    """Score a run's raw rows; write ``<stem>.md`` (tables, the issue's check) and the PNG."""
    vanilla = raw['vanilla']
    lines, counts = score_lines(raw, _rouge_l_scorer())
    text = report_lines(lines, f"items: {', '.join(counts)}; {raw['minutes']:.1f} min")
    text += ['', selection_text(vanilla, raw['items']) + '.']
    if 'alpha=0.95' in raw['methods']:
        text += ['', '### TimeBill best within the intervals where a method completes >= 50 %, '
                 "at a completion rate within 10 points of alpha=0.95's", '',
                 '| policy | T / t_v | counted | best within CI | completion gap | holds |',
                 '|---|---|---|---|---|---|']
        text += [f"| {v['policy']} | {v['fraction']:.2f} | {v['counted']} | {v['best']} | "
                 f"{v['gap']:+.2f} | {v['holds']} |" for v in scores.fig7_verdict(lines)]
    text += drift_lines(vanilla_drift(raw['rows'], vanilla))
    text += ['', "### Each TimeBill method's decisions against what happened", '',
             'N_v and t_v: the Vanilla answer\'s tokens and seconds; t: the job\'s own seconds. '
             'Coverage (run): completed jobs whose t - queue <= t^_WCET (what t^_WCET bounds; - '
             'where the rows lack the queue time); coverage (queue included): whose t <= '
             't^_WCET.', ''] + diagnostics_lines(
                 timebill_diagnostics(raw['rows'], vanilla))
    text += ['', 'Time model (ETE) fit:', '```', raw.get('calibration', ''), '```']
    (pathlib.Path(out_dir) / f'{stem}.md').write_text('\n'.join(text) + '\n', encoding='utf-8')
    if any(name.startswith('timebill-k') for name in raw['methods']):  # --k-sweep
        plot_k(lines, pathlib.Path(out_dir) / f'{stem}.png')
    else:
        plot(lines, pathlib.Path(out_dir) / f'{stem}.png', raw['methods'])
    print('\n'.join(text))
    return 0


def report_from(raw_path):
    """Rewrite the tables and the plot of a run from its ``*_raw.json``."""
    raw_path = pathlib.Path(raw_path)
    raw = json.loads(raw_path.read_text(encoding='utf-8'))
    return write_report(raw, raw_path.parent, raw_path.name[:-len('_raw.json')])


def add_arguments(parser):
    """Add the robot-context flags to ``timebill bench``'s parser."""
    parser.add_argument('--items', type=int, default=60,
                        help='robot-context: items kept after the Vanilla pass (0: all)')
    parser.add_argument('--k-sweep', action='store_true',
                        help='robot-context: Fig. 8, TimeBill at k = 1..8 under Kill')
    # 0.95: where alpha* is interior here (Vanilla completes about a third, alpha = 0.95
    # nearly all); at 0.75 and below TimeBill takes alpha_max whatever k is.
    parser.add_argument('--k-fraction', type=float, default=0.95,
                        help='robot-context --k-sweep: the budget fraction T / t_v')
    parser.add_argument('--vanilla', metavar='VANILLA_JSON',
                        help='robot-context --k-sweep: take t_v and the references from this '
                             "Vanilla pass (a Fig. 7 run's robot_bench_vanilla.json) instead "
                             'of running one, so Fig. 8 has the same budgets')
    parser.add_argument('--policies', default='kill,skip_next',
                        help='robot-context: comma list of overrun policies to run')
    parser.add_argument('--model', default='', metavar='FILE.gguf',
                        help='robot-context: serve this GGUF file instead of the embedded '
                             'model (its own predictors: `timebill predictor build --model`)')
    parser.add_argument('--repeats', metavar='RAW_JSON', nargs='+',
                        help='robot-context: only write repeats.md (spread between repeats, '
                             "timebill-online's check) from these runs' raw rows")
    parser.add_argument('--report', metavar='RAW_JSON',
                        help='robot-context: only rewrite the tables and plot of a run')
