"""``timebill remotebench``: deadlines on a shared serving engine, node against client timeouts.

A llama.cpp server (llama-cpp-python) serves the embedded model on loopback. The same
follow-up goals (questions over a few robot fleet logs) go

* **through the node**: ``timebill serve`` with ``engine.backend: openai`` on that server,
  goals sent over ROS with a time budget under Kill; and
* **straight to the server** with a client-side timeout at the same budget, as vLLM users
  do today: the client streams and closes the connection when the time is up.

Each goal's budget is a fraction of its own free-run time (the answer sent straight, no
limit, on the quiet server). Per budget fraction the report gives: goals answered on time
(both methods on the client's clock: send to the whole answer within the budget; the node's
own ``deadline_met``, counted from the goal's receipt, beside it), the share of the free
answer's tokens those answers hold and their token counts, the server's wasted time and
tokens (a goal that missed: everything the server did for it), the node's refusal latency
(send to REJECTED result, over ROS) and kill latency, and t^_WCET's coverage of the run
(queue excluded, what it bounds) and of send to result (queue and ROS included)
(:func:`run_goals` says how the goals are played). ``--report RAW.json`` rewrites the table,
the plot and the JSON's ``table`` from the JSON's rows alone.
"""

import contextlib
import dataclasses
import json
import os
import pathlib
import queue
import statistics
import time

CONTEXT_TOKENS = (500, 700, 900, 600)   # the fleet logs' sizes, tokens (one seed each)
QUESTIONS = ('Which robot waited longest for a door? Answer in one sentence.',
             'Summarize what AMR-3 did, in three sentences.',
             'List the errors in the log with their times.',
             'Which docks were visited? Answer with a list.',
             'What should the fleet manager check first, and why?',
             'When did AMR-1 start charging the first time?')
FRACTIONS = (0.05, 0.5, 0.8, 1.2)
N_MAX = 128
SERVER_CTX = 4096


@dataclasses.dataclass
class Row:
    """One goal under one method at one budget fraction."""

    method: str
    fraction: float
    goal: int
    budget_s: float
    on_time: bool
    status: str
    tokens: int
    free_tokens: int
    wasted_s: float
    wasted_tokens: int
    wall_s: float
    max_tokens_sent: int = 0
    wcet_s: float = 0.0
    execution_s: float = 0.0


def goals(tokenizer):
    """Return [(system context, question)]: every question over every log."""
    from timebill_ros.bench.prefix import robot_log
    return [(robot_log(n_tokens, tokenizer, seed=seed), question)
            for seed, n_tokens in enumerate(CONTEXT_TOKENS) for question in QUESTIONS]


def straight(url, model, context, question, budget_s, max_tokens=N_MAX):
    """Send one goal straight to the server, closing it at ``budget_s`` (None: no limit).

    Returns (on_time, tokens, seconds, text): the request's seconds from send to its end or
    close, the tokens streamed meanwhile.
    """
    from timebill_ros.engine.remote import client
    from timebill_ros.server.backends.openai import parse_chunk
    body = {'model': model.name, 'prompt': model.prompt_text(question, context),
            'max_tokens': max_tokens, 'temperature': 0.0}
    start = time.monotonic()
    stream = client.CompletionStream(client.Endpoint.parse(url), '/completions', body, 2.0,
                                     60.0, parse=parse_chunk)
    parts = []
    while True:
        left = None if budget_s is None else start + budget_s - time.monotonic()
        if left is not None and left <= 0:
            stream.close()
            return False, len(parts), time.monotonic() - start, ''.join(parts)
        try:
            event = stream.events.get(timeout=0.005 if left is None else min(0.005, left))
        except queue.Empty:
            continue
        if event.kind == client.TEXT:
            parts.append(event.text)
        elif event.kind == client.ERROR:
            raise event.error
        else:
            return True, len(parts), event.at_s - start, ''.join(parts)


def node_goal(ros_client, context, question, budget_s):
    """Send one goal through the node under Kill; return (Instruct.Result, wall seconds)."""
    from timebill_ros.action import Instruct
    from timebill_ros.ros.client import make_goal
    goal = make_goal(question, budget_s=budget_s, max_new_tokens=N_MAX,
                     policy=Instruct.Goal.POLICY_KILL, system_prompt=context)
    start = time.monotonic()
    result, _ = ros_client.run(goal, timeout_s=budget_s + 60.0)
    return result, time.monotonic() - start


def node_row(result, wall_s, fraction, index, budget_s, free_tokens):
    """Return the Row of a node result."""
    from timebill_ros.ros.conversions import duration_to_s
    from timebill_ros.server import status
    execution_s = duration_to_s(result.total_time) - duration_to_s(result.queue_time)
    on_time = result.status == status.COMPLETED and result.deadline_met
    sent = result.max_tokens_sent > 0
    wasted = sent and not on_time
    return Row('node', fraction, index, budget_s, on_time, status.STATUS_NAMES[result.status],
               result.response_tokens, free_tokens, execution_s if wasted else 0.0,
               result.response_tokens if wasted else 0, wall_s, result.max_tokens_sent,
               duration_to_s(result.predicted_wcet), execution_s)


def run_goals(url, model, ros_client, items, say):
    """Play each goal at each fraction: free, then by both methods; return the Rows.

    Each goal's budget is a fraction of a free run measured just before its two methods
    run: this VM's speed drifts by up to 2x within a minute (the server's step went from 7
    to 17 ms and back in a first run, with nothing else running), so a budget from a free
    pass played minutes earlier would not be the fraction it claims. Before every request
    the goal is sent through the node with max_new_tokens 1 (Skip-Next, a loose budget):
    every request then starts with its whole prompt held by the server, and the node knows
    it (it knows what the server holds only from what it sent itself,
    engine/remote/model.py), as a robot that keeps its context warm. The methods take turns
    going first on each goal.
    """
    rows, free = [], []
    for fraction in FRACTIONS:
        for index, (context, question) in enumerate(items):
            warm(ros_client, context, question)
            _, free_tokens, free_s, _ = straight(url, model, context, question, None)
            free.append({'fraction': fraction, 'goal': index, 'seconds': free_s,
                         'tokens': free_tokens})
            for method in (('node', 'client') if index % 2 == 0 else ('client', 'node')):
                warm(ros_client, context, question)
                rows.append(_play(method, url, model, ros_client, context, question,
                                  fraction, index, (free_s, free_tokens)))
        say(f'fraction {fraction}: done')
    return free, rows


def warm(ros_client, context, question):
    """Send the goal through the node for one token, with a loose budget (Skip-Next)."""
    from timebill_ros.action import Instruct
    from timebill_ros.ros.client import make_goal
    ros_client.run(make_goal(question, budget_s=30.0, max_new_tokens=1,
                             policy=Instruct.Goal.POLICY_SKIP_NEXT, system_prompt=context),
                   timeout_s=60.0)


def _play(method, url, model, ros_client, context, question, fraction, index, free):
    """Return the Row of one goal by ``method`` at ``fraction`` of its free-run time."""
    free_s, free_tokens = free
    budget_s = round(fraction * free_s, 3)
    if method == 'node':
        result, wall_s = node_goal(ros_client, context, question, budget_s)
        return node_row(result, wall_s, fraction, index, budget_s, free_tokens)
    on_time, tokens, seconds, _ = straight(url, model, context, question, budget_s)
    return Row('client', fraction, index, budget_s, on_time,
               'COMPLETED' if on_time else 'TIMED_OUT', tokens, free_tokens,
               0.0 if on_time else seconds, 0 if on_time else tokens, seconds)


def on_time(row):
    """Return whether the whole answer reached the client within the budget, on its clock.

    A client row's ``on_time`` is already that. A node row's is the node's ``deadline_met``
    (from the goal's receipt); its answer counts here only if the client also had it by the
    budget (``wall_s``: send to result over ROS), the clock the client method is judged on.
    """
    return row.on_time and row.wall_s <= row.budget_s


def wasted(row):
    """Return (server seconds, tokens) spent on a goal that missed, on the client's clock.

    The row's own figures, plus a node answer the node counted on time that reached the
    client after the budget: its run and tokens, as for any late answer.
    """
    if row.on_time and not on_time(row) and row.max_tokens_sent > 0:
        return row.wasted_s + row.execution_s, row.wasted_tokens + row.tokens
    return row.wasted_s, row.wasted_tokens


def summarize(rows):
    """Return one dict per (fraction, method): the report's figures."""
    table = []
    for fraction in FRACTIONS:
        for method in ('node', 'client'):
            mine = [r for r in rows if r.fraction == fraction and r.method == method]
            if not mine:
                continue
            done = [r for r in mine if on_time(r)]
            refused = [r for r in mine if r.status == 'REJECTED']
            killed = [r for r in mine if r.status == 'KILLED']
            ran = [r for r in mine if r.status == 'COMPLETED' and r.method == 'node']
            tokens = sorted(r.tokens for r in done)
            table.append({
                'fraction': fraction, 'method': method, 'goals': len(mine),
                'on_time': len(done),
                'deadline_met': (sum(r.on_time for r in mine) if method == 'node' else None),
                'on_time_tokens': ((tokens[0], statistics.median(tokens), tokens[-1])
                                   if tokens else None),
                'on_time_one_token': sum(t == 1 for t in tokens),
                'token_share': (statistics.mean(min(1.0, r.tokens / max(r.free_tokens, 1))
                                                for r in done) if done else 0.0),
                'wasted_s': sum(wasted(r)[0] for r in mine),
                'wasted_tokens': sum(wasted(r)[1] for r in mine),
                'refused': len(refused),
                'refusal_ms_max': max((r.wall_s * 1e3 for r in refused), default=0.0),
                'killed': len(killed),
                'kill_late_ms_max': max(((r.wall_s - r.budget_s) * 1e3 for r in killed),
                                        default=0.0),
                'wcet_coverage': (sum(r.wcet_s >= r.execution_s for r in ran) / len(ran)
                                  if ran else None),
                'wcet_coverage_send_to_result': (sum(r.wcet_s >= r.wall_s for r in ran)
                                                 / len(ran) if ran else None),
                'capped': sum(0 < r.max_tokens_sent < N_MAX for r in mine)})
    return table


def report(table, meta):
    """Return the Markdown report of ``table``."""
    again = ([f'Recompute: `{meta["report_command"]}` (reads only the rows of the JSON beside '
              'this file)  '] if meta.get('report_command') else [])
    lines = ['# Remote backend: the node against client-side timeouts', '',
             f'Command: `{meta["command"]}`  ', *again,
             f'Host: {meta["host"]}; date {meta["date"]}; '
             f'{meta["goals"]} goals, N_max {N_MAX}, llama-cpp-python {meta["llama"]} on '
             f'loopback ({meta["threads"]} threads), the embedded SmolLM2-135M Q4_1.', '',
             'Budget = fraction x the goal\'s free-run time. On time: a whole answer (node: '
             'possibly cut at the max_tokens it chose) by the deadline on the client\'s clock, '
             'send to the answer\'s end, for both methods. Node deadline_met: on time by the '
             'node\'s own clock, from the goal\'s receipt (a goal can meet it and still reach '
             'the client after the budget). Tokens: min / median / max of the on-time '
             'answers, and how many of them are 1 token. Token share: tokens of the on-time '
             'answers over the free answer\'s. Wasted: server seconds and tokens spent on '
             'goals that missed. Refusal: send to REJECTED over ROS (max). t^_WCET coverage, '
             'completed node goals: t^_WCET >= the run (queue excluded, what it bounds) / '
             '>= send to result on the client (queue and ROS included).',
             '', '| budget | method | on time | node deadline_met | tokens (1-token) | '
             'token share | wasted s | wasted tokens | refused (max ms) | killed (max late '
             'ms) | max_tokens capped | t^_WCET coverage: run / send to result |',
             '|---|---|---|---|---|---|---|---|---|---|---|---|']
    for row in table:
        coverage = ('-' if row['wcet_coverage'] is None else
                    f'{row["wcet_coverage"]:.2f} / {row["wcet_coverage_send_to_result"]:.2f}')
        refused = (f'{row["refused"]} ({row["refusal_ms_max"]:.1f})' if row['refused']
                   else '0')
        killed = (f'{row["killed"]} ({row["kill_late_ms_max"]:.1f})' if row['killed']
                  else '0')
        met = '-' if row['deadline_met'] is None else f'{row["deadline_met"]}/{row["goals"]}'
        tokens = ('-' if row['on_time_tokens'] is None else
                  '{} / {:g} / {}'.format(*row['on_time_tokens'])
                  + f' ({row["on_time_one_token"]})')
        lines.append(f'| {row["fraction"]:.2f} t_free | {row["method"]} | {row["on_time"]}/'
                     f'{row["goals"]} | {met} | {tokens} | {row["token_share"]:.2f} | '
                     f'{row["wasted_s"]:.1f} | {row["wasted_tokens"]} | {refused} | {killed} | '
                     f'{row["capped"]} | {coverage} |')
    return '\n'.join(lines) + '\n'


def plot(table, path):
    """Draw on-time goals and wasted server seconds per budget, node beside client."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    width = 0.35
    for offset, method in ((-width / 2, 'node'), (width / 2, 'client')):
        mine = [r for r in table if r['method'] == method]
        x = [i + offset for i in range(len(mine))]
        axes[0].bar(x, [r['on_time'] / r['goals'] for r in mine], width, label=method)
        axes[1].bar(x, [r['wasted_s'] for r in mine], width, label=method)
    labels = [f'{f:g}' for f in FRACTIONS]
    for axis, title in zip(axes, ('goals on time (share)', 'wasted server time (s)')):
        axis.set_xticks(range(len(labels)), labels)
        axis.set_xlabel('budget / free-run time')
        axis.set_title(title)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def node_params(folder, url, overrides):
    """Write the node's params file (remote backend on ``url``); return its path."""
    from timebill_ros import params
    config = params.load_config(None, [
        'engine.backend=openai', f'engine.remote_url={url}',
        f'engine.remote_context_tokens={SERVER_CTX}', f'engine.max_new_tokens={N_MAX}',
        'predictor.kind=fallback', *overrides])
    path = pathlib.Path(folder) / 'remote_node.yaml'
    path.write_text(params.to_yaml(config))
    return str(path)


def run_remotebench(args):
    """Run the benchmark; write remote.md, remote.json and remote.png under ``args.out``."""
    if getattr(args, 'report', ''):
        return report_from(args.report)
    import platform
    from importlib.metadata import version

    from timebill_ros.bench.llama_server import LoopbackLlamaServer
    from timebill_ros.bench.server_process import served
    from timebill_ros.config import EngineConfig
    from timebill_ros.engine.remote.model import RemoteModel
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logs = pathlib.Path('log/remotebench')
    logs.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(LoopbackLlamaServer(
            n_ctx=SERVER_CTX, threads=args.threads, log_path=logs / 'llama_server.log'))
        model = RemoteModel.load(EngineConfig(), server.models()[0])
        items = goals(model.tokenizer)[:args.goals or None]
        ros_client = stack.enter_context(served(node_params(logs, server.url, args.set),
                                                logs / 'node.log', node_name='remote_node'))
        free, rows = run_goals(server.url, model, ros_client, items, print)
    flags = f'--out {args.out} --goals {args.goals}'
    meta = {'command': f'timebill remotebench {flags}',
            'host': f'{platform.node()} ({os.cpu_count()} CPUs)',
            'date': time.strftime('%Y-%m-%d'), 'goals': len(items),
            'llama': version('llama_cpp_python'), 'threads': args.threads,
            'minutes': round((time.monotonic() - start) / 60, 1)}
    return write_outputs(out, meta, free, rows)


def write_outputs(out, meta, free, rows):
    """Write remote.json (the rows and the table made of them), remote.md and remote.png."""
    out = pathlib.Path(out)
    table = summarize(rows)
    meta = dict(meta, report_command=f'timebill remotebench --report {out / "remote.json"}')
    (out / 'remote.json').write_text(json.dumps(
        {'meta': meta, 'free': free, 'rows': [dataclasses.asdict(r) for r in rows],
         'table': table}, indent=1))
    (out / 'remote.md').write_text(report(table, meta))
    plot(table, out / 'remote.png')
    print(report(table, meta))
    return 0


def report_from(raw_path):
    """Rewrite remote.md, remote.png and the table of ``raw_path`` from its rows alone."""
    raw_path = pathlib.Path(raw_path)
    raw = json.loads(raw_path.read_text())
    rows = [Row(**row) for row in raw['rows']]
    return write_outputs(raw_path.parent, raw['meta'], raw['free'], rows)


def add_arguments(parser):
    """Add ``timebill remotebench``'s flags."""
    parser.add_argument('--out', default='benchmarks/results/remote',
                        help='folder for remote.md, remote.json and remote.png')
    parser.add_argument('--goals', type=int, default=0, help='first N goals only (0: all 24)')
    parser.add_argument('--threads', type=int, default=2, help="the llama server's threads")
    parser.add_argument('--set', action='append', default=[], metavar='GROUP.FIELD=VALUE',
                        help="override a node parameter (repeatable)")
    parser.add_argument('--report', metavar='RAW.json', default='',
                        help='rewrite the table, the plot and the JSON\'s table from a '
                        'remote.json\'s rows (no run)')
