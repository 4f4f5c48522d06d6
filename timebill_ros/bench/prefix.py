"""``timebill prefixbench``: follow-up questions over a shared context, with and without reuse.

A robot log of ~1k / 2k / 3.6k tokens is sent as the system prompt or at the head of the user
turn, then follow-up questions about it. Through the core service (the code the node runs;
the embedded model, its calibration, Kill) with ``prefix_cache.enabled`` on and off:

* prefill and end-to-end times of each follow-up, and the time model's prefill estimate;
* the smallest budget of a ladder at which each follow-up COMPLETES on time under Kill
  (without reuse the ladder starts at admission's least time: nothing below it runs);
* t^_WCET coverage on hits and on misses;
* answers with reuse against a fresh prefill on an fp32 engine at alpha* = 0 (identical?);
* a run of goals over distinct contexts under a small ``prefix_cache.max_mb``: hit rate and
  the store's size after every goal against its bound.

Writes ``prefix.md`` (tables), ``prefix.png`` and ``prefix.json`` (every goal) under ``--out``.
"""

import dataclasses
import json
import os
import platform
import random
import threading
import time

from timebill_ros.params import load_config

BUDGET_LADDER_S = (0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0)
QUESTIONS = ('Which dock did AMR-2 visit last? Answer in one sentence.',
             'What was the lowest battery level in the log? Answer with the number.',
             'Did any robot report an error? Answer yes or no, then name it.',
             'How many times did AMR-1 charge? Answer with a number.')
ROBOTS = ('AMR-1', 'AMR-2', 'AMR-3')
EVENTS = ('reached dock {d}', 'picked tote {t} at shelf {s}', 'dropped tote {t} at dock {d}',
          'started charging at {b} % battery', 'stopped charging at {b} % battery',
          'waited {w} s for a door at aisle {s}', 'reported error E{e}: wheel slip at aisle {s}')


def robot_log(n_tokens, tokenizer, seed=0):
    """Return a synthetic fleet log of about ``n_tokens`` tokens (deterministic per seed)."""
    rng = random.Random(seed)
    lines, minute = ['Fleet log of the warehouse robots (time, robot, event):'], 0
    while len(tokenizer(' \n'.join(lines))['input_ids']) < n_tokens:
        for _ in range(8):
            minute += rng.randint(1, 4)
            event = rng.choice(EVENTS).format(d=rng.randint(1, 9), t=rng.randint(100, 999),
                                              s=rng.randint(1, 40), b=rng.randint(8, 99),
                                              w=rng.randint(2, 90), e=rng.randint(10, 99))
            lines.append(f'{8 + minute // 60:02d}:{minute % 60:02d} {rng.choice(ROBOTS)} '
                         f'{event}')
    return '\n'.join(lines)


def request(context, question, placement, budget_s, max_new_tokens):
    """Return the GoalRequest of one question; the context as system prompt or user head."""
    from timebill_ros.server.goals import GoalRequest
    if placement == 'system':
        return GoalRequest(question, system_prompt=context, budget_s=budget_s,
                           max_new_tokens=max_new_tokens)
    return GoalRequest(f'{context}\n\n{question}', budget_s=budget_s,
                       max_new_tokens=max_new_tokens)


def ask(service, goal):
    """Submit ``goal`` and return its JobResult (waits)."""
    done, results = threading.Event(), []
    service.submit(goal, lambda feedback: None,
                   lambda result: (results.append(result), done.set()))
    if not done.wait(600):
        raise RuntimeError('goal did not end within 600 s')
    return results[0]


def expected_prefill_s(service, goal):
    """Return the time model's EXPECTED prefill of ``goal`` as its run will count it.

    The cached head the store holds now, and the chunks the runner will cut the rest into
    (each chunk pays the per-call overhead).
    """
    from timebill_ros.timing.chunks import chunk_sizes
    from timebill_ros.timing.online import EXPECTED
    engine = service.engine
    ids = engine.encode(goal.prompt, goal.system_prompt)
    n_cached = 0
    if engine.prefix_store is not None:
        n_cached = min(engine.prefix_store.held_tokens(ids),
                       engine.prefix_store.usable_tokens(len(ids)))
    chunks = chunk_sizes(service.time_model, service.config.engine, engine.n_layers, len(ids),
                         n_cached)
    return service.time_model.prefill_s(len(ids), EXPECTED, len(chunks), n_cached)


def row(result, predicted_prefill_s, **extra):
    """Return the JSON row of one goal."""
    return dict(extra, status=result.status_name, message=result.message,
                budget_s=result.budget_s, prompt_tokens=result.prompt_tokens,
                cached_tokens=result.cached_tokens, prefill_s=result.prefill_time_s,
                predicted_prefill_s=predicted_prefill_s, decode_s=result.decode_time_s,
                total_s=result.total_time_s, execution_s=result.execution_time_s,
                wcet_s=result.predicted_wcet_s, min_time_s=result.min_time_s,
                alpha=result.eviction_ratio, response_tokens=result.response_tokens,
                deadline_met=result.deadline_met, response=result.response)


def on_time(result):
    """Return True for a COMPLETED goal that met its deadline."""
    from timebill_ros.server import status
    return result.status == status.COMPLETED and result.deadline_met


def smallest_budget(service, context, question, placement, max_new_tokens, reuse, rows, say,
                    n_tokens):
    """Return the smallest ladder budget at which the question completes on time, or None.

    n_tokens: the context's nominal length, tokens (for the rows).
    Without reuse the ladder starts at admission's least time (lower budgets are refused
    at once) and grows by 1.25x: a long context's prefill alone takes seconds.
    """
    ladder = list(BUDGET_LADDER_S)
    if not reuse:
        probe = ask(service, request(context, question, placement, 0.5, max_new_tokens))
        start = max(probe.min_time_s * 1.05, 0.5)
        ladder = [start * 1.25 ** k for k in range(8)]
    for budget_s in ladder:
        goal = request(context, question, placement, budget_s, max_new_tokens)
        predicted = expected_prefill_s(service, goal)
        result = ask(service, goal)
        rows.append(row(result, predicted, kind='ladder', reuse=reuse, placement=placement,
                        context_tokens=n_tokens, question=question))
        say(f'  budget {budget_s:.2f} s: {result.status_name} {result.message[:70]}')
        if on_time(result):
            return budget_s
    return None


def build(params_file, overrides, reuse, max_mb=None, log=print):
    """Return a started service on the embedded model with the prefix store on or off."""
    from timebill_ros.server.factory import build_service
    items = list(overrides) + [f'prefix_cache.enabled={str(reuse).lower()}',
                               'predictor.kind=fallback', 'predictor.prefill_readout=false']
    if max_mb is not None:
        items.append(f'prefix_cache.max_mb={max_mb}')
    service = build_service(load_config(params_file, items), log=log)
    service.start()
    return service


def answers_identical(context_text, placement, questions, max_new_tokens):
    """Return [(question, identical?)] of hit vs fresh prefill on an fp32 engine, alpha* 0."""
    from timebill_ros.config import EngineConfig, EvictionConfig, PrefixCacheConfig
    from timebill_ros.engine import LlmEngine
    from timebill_ros.engine.stopping import StopCriteria
    engine = LlmEngine.load(EngineConfig(decode_weights='float32'), EvictionConfig(),
                            PrefixCacheConfig())
    out = []
    for question in questions:
        goal = request(context_text, question, placement, 1.0, max_new_tokens)
        ids = engine.encode(goal.prompt, goal.system_prompt)
        hit = engine.prefill(ids, StopCriteria(), prefix=engine.match_prefix(ids),
                             store=engine.prefix_store)
        fresh = engine.prefill(ids, StopCriteria())
        got = engine.decode(hit, max_new_tokens, StopCriteria()).token_ids
        want = engine.decode(fresh, max_new_tokens, StopCriteria()).token_ids
        out.append((question, hit.n_cached > 0, got == want))
    return out


def rotation_run(params_file, overrides, n_goals, n_contexts, context_tokens, max_mb,
                 max_new_tokens, say):
    """Return rows of ``n_goals`` goals over ``n_contexts`` contexts under ``max_mb``."""
    service = build(params_file, overrides, True, max_mb, log=lambda line: None)
    try:
        tokenizer = service.engine.tokenizer
        contexts = [robot_log(context_tokens, tokenizer, seed=100 + k) for k in range(n_contexts)]
        rng, rows = random.Random(7), []
        for index in range(n_goals):
            k = rng.randrange(n_contexts)
            goal = request(contexts[k], rng.choice(QUESTIONS), 'system', 60.0, max_new_tokens)
            result = ask(service, goal)
            stats = service.engine.prefix_store.stats()
            rows.append(dict(index=index, context=k, cached_tokens=result.cached_tokens,
                             status=result.status_name, prefill_s=result.prefill_time_s,
                             store_bytes=stats.bytes, max_bytes=stats.max_bytes,
                             dropped_blocks=stats.dropped_blocks))
            if index % 10 == 9:
                say(f'rotation: {index + 1}/{n_goals} goals, hit rate {stats.hit_rate:.2f}, '
                    f'store {stats.bytes / 2 ** 20:.0f}/{stats.max_bytes / 2 ** 20:.0f} MiB')
        return rows, dataclasses.asdict(service.engine.prefix_store.stats())
    finally:
        service.shutdown()


def run_prefixbench(args):
    """Run the benchmark and write its tables; return 0 (``--report``: from prefix.json)."""
    os.makedirs(args.out, exist_ok=True)
    if args.report:
        from timebill_ros.bench.prefix_report import write_report
        with open(os.path.join(args.out, 'prefix.json'), encoding='utf-8') as stream:
            write_report(json.load(stream), os.path.join(args.out, 'prefix.md'))
        return 0
    say = print
    rows, budgets, identity = [], [], []
    for reuse in (True, False):
        service = build(args.params_file, args.set, reuse, log=say if reuse else print)
        try:
            tokenizer = service.engine.tokenizer
            for n_tokens in args.context_tokens:
                context = robot_log(n_tokens, tokenizer)
                for placement in args.placements:
                    say(f'== reuse {reuse}, context ~{n_tokens} tokens as {placement} ==')

                    def measured(kind, question, budget_s):
                        """Ask ``question``; keep its row; return (result, predicted prefill)."""
                        goal = request(context, question, placement, budget_s,
                                       args.max_new_tokens)
                        predicted = expected_prefill_s(service, goal)
                        result = ask(service, goal)
                        rows.append(row(result, predicted, kind=kind, reuse=reuse,
                                        placement=placement, context_tokens=n_tokens,
                                        question=question))
                        return result, predicted

                    measured('first', QUESTIONS[0], 120.0)
                    for question in QUESTIONS[1:1 + args.questions]:
                        result, predicted = measured('follow-up', question, 120.0)
                        say(f'follow-up: prefill {result.prefill_time_s:.2f} s (predicted '
                            f'{predicted:.2f}), cached {result.cached_tokens}, total '
                            f'{result.total_time_s:.2f} s')
                        smallest = smallest_budget(service, context, question, placement,
                                                   args.max_new_tokens, reuse, rows, say,
                                                   n_tokens)
                        budgets.append(dict(reuse=reuse, placement=placement,
                                            context_tokens=n_tokens, question=question,
                                            smallest_budget_s=smallest))
                        result, _ = measured('kill-budget', question, args.kill_budget_s)
                        say(f'at {args.kill_budget_s} s under Kill: {result.status_name} '
                            f'({result.message[:80]})')
        finally:
            service.shutdown()
    for n_tokens in args.context_tokens:
        for placement in args.placements:
            context = robot_log(n_tokens, tokenizer)
            for question, was_hit, same in answers_identical(
                    context, placement, QUESTIONS[:1 + args.questions], args.max_new_tokens):
                identity.append(dict(context_tokens=n_tokens, placement=placement,
                                     question=question, hit=was_hit, identical=same))
    rotation, rotation_stats = rotation_run(args.params_file, args.set, args.rotation_goals,
                                            args.rotation_contexts, args.rotation_tokens,
                                            args.rotation_max_mb, args.max_new_tokens, say)
    data = dict(host=platform.node(), cpu=platform.processor() or platform.machine(),
                date=time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), args=vars(args),
                goals=rows, smallest_budgets=budgets, identity=identity,
                rotation=rotation, rotation_stats=rotation_stats)
    with open(os.path.join(args.out, 'prefix.json'), 'w', encoding='utf-8') as stream:
        json.dump(data, stream, indent=1, default=str)
    from timebill_ros.bench.prefix_report import write_report
    write_report(data, os.path.join(args.out, 'prefix.md'))
    print(open(os.path.join(args.out, 'prefix.md'), encoding='utf-8').read())
    return 0


def add_arguments(parser):
    """Add ``timebill prefixbench``'s flags."""
    parser.add_argument('--params-file', default=None, help='ROS 2 params YAML')
    parser.add_argument('--set', action='append', default=[], metavar='GROUP.FIELD=VALUE',
                        help='override a parameter (repeatable)')
    parser.add_argument('--out', default='benchmarks/results/prefix',
                        help='folder for prefix.md and prefix.json')
    parser.add_argument('--context-tokens', type=int, nargs='+', default=[1000, 2000, 3600])
    parser.add_argument('--placements', nargs='+', default=['system', 'user'],
                        choices=['system', 'user'])
    parser.add_argument('--questions', type=int, default=3, help='follow-ups per context')
    parser.add_argument('--max-new-tokens', type=int, default=64)
    parser.add_argument('--kill-budget-s', type=float, default=2.5)
    parser.add_argument('--rotation-goals', type=int, default=100)
    parser.add_argument('--rotation-contexts', type=int, default=10)
    parser.add_argument('--rotation-tokens', type=int, default=600)
    parser.add_argument('--rotation-max-mb', type=float, default=128.0)
    parser.add_argument('--report', action='store_true',
                        help='only rewrite prefix.md and prefix.png from --out/prefix.json')
