"""Time to first token of a ~100-token follow-up on a cached ~2k-token context, vs llama.cpp.

    timebill study followup_ttft FILE.gguf [--context-tokens 2000] [--followups 8]
        [--repeats 2] [--node] [--out DIR]

A robot's follow-up goal: the fleet log of ``timebill prefixbench`` (~2k tokens) as the system
prompt, then questions of their own (a fresh status report and a question, ~100 tokens none of
which is cached). Through the core service - the code the node runs, on ``FILE`` with the
prefix store on: a first goal caches the context, then each follow-up's time to first token is
the ``elapsed_s`` of its first decoding-phase feedback (receipt to the end of its prefill:
admission, prediction, the store's lookup and the prefill of the uncached tokens). Beside each,
llama.cpp on the same file and threads: the context's token ids evaluated (not timed), then
the follow-up's own ids timed - the same tokens our store missed. ``--repeats`` builds the
service anew each time (its own start-up calibration). ``--node``: through the node instead,
``timebill serve`` on FILE as its own process and the goals sent over ROS; the time to first
token is the ``elapsed`` of the goal's first decoding-phase feedback message (receipt to the
end of its prefill, the node's clock), and ``--repeats`` starts the server anew each time.
Writes followup_ttft.json (every goal) and followup_ttft.md (medians and ratios) into --out.
"""

import argparse
import pathlib
import statistics
import sys
import threading

from timebill_ros.bench.rows import saved_or_measured

STATUS_WORDS = ('nominal', 'degraded', 'charging', 'waiting', 'blocked', 'idle', 'loaded')


def followup_question(i: int, n_words: int = 42) -> str:
    """Return follow-up ``i``: a status report of its own (~n_words words) and a question."""
    words = [f'AMR-{1 + (i + k) % 3} at aisle {(7 * i + 3 * k) % 40 + 1} is '
             f'{STATUS_WORDS[(i + k) % len(STATUS_WORDS)]};' for k in range(n_words // 6)]
    return (f'Status report {i}: ' + ' '.join(words)
            + ' Given the log and this report, which robot should take the next tote? '
            'Answer in one sentence.')


def ask_ttft(service, goal):
    """Submit ``goal``; return (JobResult, seconds from receipt to its first decoding feedback)."""
    from timebill_ros.server import status
    done, results, first = threading.Event(), [], []

    def on_feedback(feedback):
        if feedback.phase == status.PHASE_DECODE and not first:
            first.append(feedback.elapsed_s)

    service.submit(goal, on_feedback, lambda result: (results.append(result), done.set()))
    if not done.wait(600):
        raise RuntimeError('goal did not end within 600 s')
    return results[0], (first[0] if first else None)


def run_once(path, args, llama, say):
    """Return the rows of one service build: each follow-up, ours and llama.cpp's."""
    from timebill_ros.bench.prefix import build, request, robot_log
    service = build(None, [f'engine.model_path={path}'], reuse=True, log=say)
    rows = []
    try:
        engine = service.engine
        context = robot_log(args.context_tokens, engine.tokenizer)
        first, _ = ask_ttft(service, request(context, 'Which dock did AMR-2 visit last?',
                                             'system', 120.0, args.max_new_tokens))
        say(f'first goal: {first.status_name}, {first.prompt_tokens} tokens, prefill '
            f'{first.prefill_time_s:.2f} s')
        for i in range(args.followups):
            question = followup_question(i)
            result, ttft_s = ask_ttft(service, request(context, question, 'system', 120.0,
                                                       args.max_new_tokens))
            ids = engine.encode(question, context)
            cached = result.cached_tokens
            llama_s = llama.followup_prefill_s(ids[:cached], ids[cached:])
            rows.append(dict(followup=i, status=result.status_name,
                             prompt_tokens=result.prompt_tokens, cached_tokens=cached,
                             new_tokens=len(ids) - cached, ttft_s=ttft_s,
                             prefill_s=result.prefill_time_s, llama_cpp_s=llama_s))
            say(f'follow-up {i}: {len(ids) - cached} new tokens after {cached} cached: time '
                f'to first token {ttft_s:.3f} s (prefill {result.prefill_time_s:.3f}), '
                f'llama.cpp {llama_s:.3f} s')
    finally:
        service.shutdown()
    return rows


def run_node(path, args, llama, say):
    """Return the rows of one server process: each follow-up over ROS, ours and llama.cpp's."""
    from timebill_ros import params
    from timebill_ros.bench.prefix import robot_log
    from timebill_ros.bench.server_process import start_server, stop_server
    from timebill_ros.config import EngineConfig, EvictionConfig, ServerConfig
    from timebill_ros.engine import LlmEngine
    from timebill_ros.ros.client import client_session, make_goal
    from timebill_ros.ros.conversions import duration_to_s
    from timebill_ros.server import status
    encoder = LlmEngine.load(EngineConfig(model_path=str(path), threads=1), EvictionConfig())
    context = robot_log(args.context_tokens, encoder.tokenizer)
    folder = pathlib.Path('log')
    folder.mkdir(exist_ok=True)
    params_file = folder / 'followup_ttft_params.yaml'
    params_file.write_text(params.to_yaml(ServerConfig(engine=EngineConfig(
        model_path=str(path), max_new_tokens=args.max_new_tokens))))
    proc = start_server(str(params_file), folder / 'followup_ttft_server.log')
    rows = []

    def ask(client, question):
        first = []

        def on_feedback(feedback):
            if feedback.phase == status.PHASE_DECODE and not first:
                first.append(duration_to_s(feedback.elapsed))
        result, _ = client.run(make_goal(question, budget_s=120.0, system_prompt=context,
                                         max_new_tokens=args.max_new_tokens),
                               on_feedback=on_feedback, timeout_s=600.0)
        return result, (first[0] if first else None)
    try:
        with client_session('/timebill/instruct', 'followup_ttft_client') as client:
            while not client.wait_for_server(5.0):
                if proc.poll() is not None:
                    raise RuntimeError('server exited; see log/followup_ttft_server.log')
            first, _ = ask(client, 'Which dock did AMR-2 visit last?')
            say(f'first goal: status {first.status}, {first.prompt_tokens} tokens')
            for i in range(args.followups):
                question = followup_question(i)
                result, ttft_s = ask(client, question)
                ids = encoder.encode(question, context)
                cached = int(result.cached_tokens)
                llama_s = llama.followup_prefill_s(ids[:cached], ids[cached:])
                rows.append(dict(followup=i, status=int(result.status),
                                 prompt_tokens=int(result.prompt_tokens),
                                 cached_tokens=cached, new_tokens=len(ids) - cached,
                                 ttft_s=ttft_s, prefill_s=duration_to_s(result.prefill_time),
                                 llama_cpp_s=llama_s))
                say(f'follow-up {i} (node): {len(ids) - cached} new tokens after {cached} '
                    f'cached: time to first token {ttft_s:.3f} s, llama.cpp {llama_s:.3f} s')
    finally:
        say(f'server exited with code {stop_server(proc)}')
    return rows


def table(runs) -> str:
    """Return the Markdown table of every run's medians and the ratio."""
    lines = ['| run | follow-ups | new tokens (median) | cached tokens (median) | time to first '
             'token (s) | of it the prefill (s) | llama.cpp (s) | ours / llama.cpp |',
             '|---|---|---|---|---|---|---|---|']
    for k, rows in enumerate(runs, 1):
        def median(key):
            return statistics.median(r[key] for r in rows)
        lines.append(f'| {k} | {len(rows)} | {median("new_tokens"):.0f} | '
                     f'{median("cached_tokens"):.0f} | {median("ttft_s"):.3f} | '
                     f'{median("prefill_s"):.3f} | {median("llama_cpp_s"):.3f} | '
                     f'{median("ttft_s") / median("llama_cpp_s"):.2f} |')
    return '\n'.join(lines)


def main(argv=None):
    """Run the benchmark, or (``--report``) rewrite the table from --out's JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('model', nargs='?', help='GGUF file (not with --report)')
    parser.add_argument('--context-tokens', type=int, default=2000)
    parser.add_argument('--followups', type=int, default=8)
    parser.add_argument('--repeats', type=int, default=2)
    parser.add_argument('--max-new-tokens', type=int, default=8)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--node', action='store_true',
                        help='through the node over ROS (timebill serve as its own process)')
    parser.add_argument('--out', default='benchmarks/results/followup_ttft')
    parser.add_argument('--report', action='store_true',
                        help="only rewrite followup_ttft.md from --out's followup_ttft.json")
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    if not args.report and not args.model:
        parser.error('a GGUF file is needed')
    path = pathlib.Path(args.model or '.').expanduser()

    def measured():
        import torch

        from timebill_ros.bench.llama_cpp import LlamaCppEngine
        torch.set_num_threads(args.threads)
        llama = LlamaCppEngine(args.threads, args.context_tokens + 1024, path)
        run = run_node if args.node else run_once
        return dict(file=path.name, through='node' if args.node else 'service',
                    runs=[run(path, args, llama, print) for _ in range(args.repeats)])
    command = 'timebill study followup_ttft ' + ' '.join(
        argv if argv is not None else sys.argv[1:])
    data = saved_or_measured(out / 'followup_ttft.json', args.report, measured, command)
    text = (f'# Follow-up time to first token: {data["file"]}, through the '
            f'{data.get("through", "service")}\n\n'
            f'Host {data["host"]} ({data["machine"]}), {data["date"]}; command: '
            f'`{data["command"]}`. Raw rows: followup_ttft.json; this table: '
            f'`timebill study followup_ttft --report --out {out}`.\n\n'
            + table(data['runs']) + '\n')
    (out / 'followup_ttft.md').write_text(text)
    print(text)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
