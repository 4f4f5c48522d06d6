"""Peak resident memory of the node serving a GGUF file, goals sent over ROS.

    timebill study node_memory --model FILE.gguf [--goals 12] [--max-new-tokens 32]
        [--out DIR] [--report]

Starts ``timebill serve`` on ``engine.model_path: FILE`` as its own process (its start-up
calibration included), sends goals one after another from a planner-like client over ROS
(held-out RLP prompts and robot logs of 60-210 lines, Kill, generous budgets) and reads the
server's peak resident set (``VmHWM`` of /proc/<pid>/status, the kernel's own high-water mark)
after the last goal, before it stops. Writes <file stem>.json and .md into --out: the peak
against the bound 1 GiB + 2 x the file, every goal's status and sizes.
"""

import argparse
import pathlib
import sys
import time

LOG_LINES = (60, 120, 210)


def peak_rss_mb(pid: int) -> float:
    """Return the process's peak resident set so far (VmHWM), MiB."""
    for line in pathlib.Path(f'/proc/{pid}/status').read_text().splitlines():
        if line.startswith('VmHWM:'):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f'no VmHWM for pid {pid}')


def goals(n_goals):
    """Return [(name, prompt)]: held-out RLP prompts and robot logs."""
    from timebill_ros import prompts
    from timebill_ros.bench.timebill import rlp_test_prompts
    logs = [(f'log{n}', prompts.long_prompt(n, seed=9000 + n)) for n in LOG_LINES]
    return (rlp_test_prompts(max(0, n_goals - len(logs))) + logs)[:n_goals]


def measure(model, n_goals, max_new_tokens):
    """Serve ``model``, send the goals, return {file_mb, peak_at_ready_mb, peak_mb, goals}."""
    from timebill_ros import params
    from timebill_ros.bench.server_process import start_server, stop_server
    from timebill_ros.config import EngineConfig, ServerConfig
    from timebill_ros.ros.client import client_session, make_goal
    from timebill_ros.ros.conversions import duration_to_s
    from timebill_ros.server.status import POLICY_KILL
    pathlib.Path('log').mkdir(exist_ok=True)
    params_file = pathlib.Path('log') / 'node_memory_params.yaml'
    params_file.write_text(params.to_yaml(ServerConfig(engine=EngineConfig(
        model_path=str(model), max_new_tokens=max_new_tokens))))
    proc = start_server(str(params_file), pathlib.Path('log') / 'node_memory_server.log')
    rows, start = [], time.monotonic()
    try:
        with client_session('/timebill/instruct', 'node_memory_client') as client:
            while not client.wait_for_server(5.0):
                if proc.poll() is not None or time.monotonic() - start > 1800:
                    raise RuntimeError('server did not come up; see log/node_memory_server.log')
            ready_mb = peak_rss_mb(proc.pid)
            for name, prompt in goals(n_goals):
                result, _ = client.run(make_goal(prompt, budget_s=600.0, policy=POLICY_KILL,
                                                 max_new_tokens=max_new_tokens),
                                       timeout_s=900.0)
                rows.append(dict(name=name, status=result.status,
                                 prompt_tokens=result.prompt_tokens,
                                 response_tokens=result.response_tokens,
                                 total_s=duration_to_s(result.total_time)))
                print(f'{name:24s} status {result.status} N_x={result.prompt_tokens:5d} '
                      f'N={result.response_tokens:3d} peak so far '
                      f'{peak_rss_mb(proc.pid):.0f} MiB', flush=True)
            peak_mb = peak_rss_mb(proc.pid)
    finally:
        print(f'server exited with code {stop_server(proc)}')
    file_mb = model.stat().st_size / 2 ** 20
    return dict(file=model.name, file_mb=file_mb, peak_at_ready_mb=ready_mb, peak_mb=peak_mb,
                bound_mb=1024 + 2 * file_mb, goals=rows)


def main(argv=None):
    """Serve, send, read the peak (or, with ``--report``, re-table a saved run)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', required=True, help='the .gguf file')
    parser.add_argument('--goals', type=int, default=12)
    parser.add_argument('--max-new-tokens', type=int, default=32)
    parser.add_argument('--out', default='benchmarks/results/node_memory')
    parser.add_argument('--report', action='store_true',
                        help="only rewrite the .md from --out's <file stem>.json")
    args = parser.parse_args(argv)
    from timebill_ros.bench.rows import saved_or_measured
    model = pathlib.Path(args.model).expanduser().resolve()
    out = pathlib.Path(args.out)
    command = 'timebill study node_memory ' + ' '.join(
        argv if argv is not None else sys.argv[1:])
    data = saved_or_measured(out / f'{model.stem}.json', args.report,
                             lambda: measure(model, args.goals, args.max_new_tokens), command)
    peak_mb, bound_mb = data['peak_mb'], data['bound_mb']
    text = (f'# Node peak memory: {data["file"]}\n\nHost {data["host"]} ({data["machine"]}), '
            f'{data["date"]}; command: `{data["command"]}`; raw: {model.stem}.json; this '
            f'table: `timebill study node_memory --model {data["file"]} --report --out '
            f'{out}`.\n\n'
            f'| file (MiB) | peak when ready (MiB) | peak after {len(data["goals"])} goals '
            f'(MiB) | '
            f'bound 1 GiB + 2 x file (MiB) | within |\n|---|---|---|---|---|\n'
            f'| {data["file_mb"]:.0f} | {data["peak_at_ready_mb"]:.0f} | {peak_mb:.0f} | '
            f'{bound_mb:.0f} | {"yes" if peak_mb <= bound_mb else "no"} |\n')
    (out / f'{model.stem}.md').write_text(text)
    print(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
