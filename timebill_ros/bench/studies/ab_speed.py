"""Does a goal run slower in one tree than in another? Same goals, alternating processes.

    timebill study ab_speed --tree before=/path/to/old --tree after=. [--rounds 3]
    timebill study ab_speed --tree after=. --tree no-warm-up=.,timing.warm_up=false

A tree may carry server parameters after its path (``PATH,NAME=VALUE,...``, values in YAML)
and environment variables of its process (``env:OMP_WAIT_POLICY=PASSIVE``), e.g.
``--tree spin=. --tree passive=.,env:OMP_WAIT_POLICY=PASSIVE``.

For each round and each tree (alternating, the order flipped every round) a fresh process
imports that tree's ``timebill_ros``, builds the server core as the node does
(``factory.build_service``), starts it, and runs the same goals one after another with
generous budgets (no eviction, no Kill): short robot instructions and robot logs of 300-2000
tokens, 64 answer tokens. Each goal reports its prefill time (per prompt token) and its
decoding time per step; the table gives the medians per tree and the after / before ratios.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

GOALS = [(0, 0), (1, 20), (2, 0), (3, 60), (4, 150), (5, 0)]  # (index, robot-log lines)
N_MAX = 64


def child():
    """Run the goals in this process; print one JSON line per goal."""
    import threading

    from timebill_ros import params, prompts
    from timebill_ros.server.factory import build_service
    from timebill_ros.server.goals import GoalRequest
    from timebill_ros.server.status import POLICY_SKIP_NEXT
    flat = {'engine.max_new_tokens': N_MAX}
    flat.update(json.loads(os.environ.get('AB_SPEED_PARAMS', '{}')))
    config = params.config_from_flat(flat)
    service = build_service(config, log=lambda line: None)
    service.start()
    try:
        for index, lines in GOALS:
            prompt = (prompts.SHORT[index][1] if lines == 0
                      else prompts.long_prompt(lines, seed=900 + index))
            done, box = threading.Event(), {}

            def on_done(result, box=box, done=done):
                box['r'] = result
                done.set()

            request = GoalRequest(prompt, budget_s=600.0, max_new_tokens=N_MAX,
                                  overrun_policy=POLICY_SKIP_NEXT)
            service.submit(request, lambda fb: None, on_done)
            done.wait(600)
            r = box['r']
            print(json.dumps({'goal': index, 'n_x': r.prompt_tokens,
                              'prefill_ms_per_token': 1e3 * r.prefill_time_s / r.prompt_tokens,
                              'step_ms': 1e3 * r.decode_time_s / max(1, r.response_tokens - 1),
                              'n': r.response_tokens}), flush=True)
    finally:
        service.shutdown()


def _run_tree(spec):
    import yaml
    path, *overrides = spec.split(',')
    env = dict(os.environ)
    pairs = [o.split('=', 1) for o in overrides]
    env.update({name[len('env:'):]: value for name, value in pairs if name.startswith('env:')})
    env['AB_SPEED_PARAMS'] = json.dumps({name: yaml.safe_load(value) for name, value in pairs
                                         if not name.startswith('env:')})
    if path != '.':
        env['PYTHONPATH'] = os.path.abspath(path)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), '--child'], env=env,
                         capture_output=True, text=True, check=True, cwd='/tmp')
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{')]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--tree', action='append', default=[],
                        metavar='LABEL=PATH[,NAME=VALUE...]')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--child', action='store_true', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child()
        return 0
    trees = [item.split('=', 1) for item in args.tree]
    rows = {label: [] for label, _ in trees}
    for i in range(args.rounds):
        for label, path in (trees if i % 2 == 0 else trees[::-1]):
            got = _run_tree(path)
            rows[label] += got
            print(f'round {i + 1} {label}: step ms ' + ' '.join(
                f"{g['step_ms']:.0f}" for g in got), flush=True)
    print('| tree | goals | prefill ms/token (median) | decode ms/step (median) |')
    print('|---|---|---|---|')
    medians = {}
    for label, got in rows.items():
        medians[label] = (statistics.median(g['prefill_ms_per_token'] for g in got),
                          statistics.median(g['step_ms'] for g in got))
        print(f'| {label} | {len(got)} | {medians[label][0]:.2f} | {medians[label][1]:.1f} |')
    if len(trees) == 2:
        (a, _), (b, _) = trees
        print(f'{b} / {a}: prefill {medians[b][0] / medians[a][0]:.3f}, '
              f'decode {medians[b][1] / medians[a][1]:.3f}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
