"""Goal and cancel responses and /diagnostics while the server decodes, as a planner sees them.

    timebill study responsiveness [--pairs 150] [--blocks 2] [--out DIR]

``timebill serve`` runs as its own process on the embedded model (default parameters). A
second client thread keeps one long answer decoding (Skip-Next, 600 s budget, 256 tokens,
goal after goal). Meanwhile the planner sends a short goal (it queues behind the long one),
waits for the goal response, cancels it and waits for the cancel response: ``--pairs`` times
per block (and for at least 12 s). Only pairs sent while the long goal's last feedback said
DECODE count. /diagnostics arrival times give its period. Each variant of the server's
environment runs in ``--blocks`` blocks, interleaved (A B A B), so the machine's drift hits
each alike; the long goals' decoding speed (tokens / decode time) shows what a variant costs.

Variants: ``switch-1ms`` (the default: ``ros.gil_switch_interval_s`` 0.001, the decoding
thread hands Python's GIL over after 1 ms); ``switch-5ms`` (0.005, Python's own default);
``omp-passive`` (1 ms and ``OMP_WAIT_POLICY=PASSIVE``: torch's worker threads sleep instead of
spinning between operators).

Writes DIR/responsiveness.md and DIR/responsiveness.json.
"""

import argparse
import json
import pathlib
import statistics
import sys
import threading
import time

from timebill_ros.bench.studies.kill_latency import percentile  # one percentile for all

VARIANTS = {  # name: (extra environment, ros.gil_switch_interval_s)
    'switch-1ms': ({}, 0.001),
    'switch-5ms': ({}, 0.005),
    'omp-passive': ({'OMP_WAIT_POLICY': 'PASSIVE'}, 0.001),
}
MIN_WINDOW_S = 12.0  # at least this long per block, for /diagnostics periods, s
LONG_PROMPT = ('Write a detailed, step-by-step maintenance manual for a mobile robot with a '
               'two-finger gripper, a lidar and four wheels. Cover every part.')


def _start(variant, log_path, node_name):
    import dataclasses
    from timebill_ros import params
    from timebill_ros.config import RosConfig, ServerConfig
    from timebill_ros.bench.server_process import start_server
    env_extra, switch_s = VARIANTS[variant]
    params_file = pathlib.Path('log') / f'{node_name}_params.yaml'
    params_file.write_text(params.to_yaml(dataclasses.replace(
        ServerConfig(), ros=RosConfig(gil_switch_interval_s=switch_s))))
    return start_server(params_file, log_path, node_name, extra_env=env_extra)


class _Busy:
    """Keeps one long answer decoding; records the phase of its last feedback."""

    def __init__(self, client):
        self.client, self.phase, self.speeds = client, None, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _on_feedback(self, feedback):
        self.phase = feedback.phase

    def _loop(self):
        from timebill_ros.ros.client import make_goal
        from timebill_ros.ros.conversions import duration_to_s
        from timebill_ros.server.status import POLICY_SKIP_NEXT
        while not self.stop.is_set():
            result, _ = self.client.run(
                make_goal(LONG_PROMPT, budget_s=600.0, max_new_tokens=256,
                          policy=POLICY_SKIP_NEXT),
                on_feedback=self._on_feedback, timeout_s=900.0)
            self.phase = None
            decode_s = duration_to_s(result.decode_time)
            if decode_s > 0 and result.response_tokens > 1:
                self.speeds.append(result.response_tokens / decode_s)


def _measure_block(client, n_pairs, node_name):
    from diagnostic_msgs.msg import DiagnosticArray
    from timebill_ros.action import Instruct
    from timebill_ros.ros.client import make_goal
    from timebill_ros.server.status import POLICY_KILL
    arrivals = []
    sub = client.create_subscription(
        DiagnosticArray, '/diagnostics',
        lambda msg: arrivals.append(time.monotonic())
        if any(s.name == f'{node_name}: deadlines' for s in msg.status) else None, 10)
    busy = _Busy(client)
    busy.thread.start()
    rows, start = [], time.monotonic()
    while len(rows) < n_pairs or time.monotonic() - start < MIN_WINDOW_S:
        if busy.phase != Instruct.Feedback.PHASE_DECODE:
            time.sleep(0.01)
            continue
        sent = time.monotonic()
        handle = client.send(make_goal('Is the gripper open?', budget_s=600.0,
                                       policy=POLICY_KILL))
        goal_ms = (time.monotonic() - sent) * 1e3
        sent = time.monotonic()
        done = threading.Event()
        handle.cancel_goal_async().add_done_callback(lambda _: done.set())
        done.wait(60)
        cancel_ms = (time.monotonic() - sent) * 1e3
        client.result(handle)
        if busy.phase == Instruct.Feedback.PHASE_DECODE:
            rows.append({'goal_ms': goal_ms, 'cancel_ms': cancel_ms})
    busy.stop.set()
    busy.thread.join(900)
    client.destroy_subscription(sub)
    inside = [t for t in arrivals if t >= start]  # also while the last long answer ends
    return rows, [b - a for a, b in zip(inside, inside[1:])], busy.speeds


def _report(blocks):
    lines = ['# Responsiveness while a goal decodes', '',
             'Command: `timebill study responsiveness`', '',
             'Goal response: send_goal -> accepted; cancel response: cancel_goal -> its '
             'response (the goal was queued behind the decoding one). ms unless noted.', '',
             '| server variant | pairs | goal p50 | goal p99 | goal max | cancel p50 | '
             'cancel p99 | cancel max | > 50 ms (goal / cancel) | /diagnostics period '
             'median, min-max (s) | long answers: tokens/s |',
             '|---|---|---|---|---|---|---|---|---|---|---|']
    for variant in VARIANTS:
        part = [b for b in blocks if b['variant'] == variant]
        if not part:
            continue
        goal = [r['goal_ms'] for b in part for r in b['rows']]
        cancel = [r['cancel_ms'] for b in part for r in b['rows']]
        period = [p for b in part for p in b['diag_periods_s']]
        speeds = [s for b in part for s in b['tokens_per_s']]
        lines.append(
            f'| {variant} | {len(goal)} | {percentile(goal, 0.5):.1f} | '
            f'{percentile(goal, 0.99):.1f} | {max(goal):.1f} | {percentile(cancel, 0.5):.1f} | '
            f'{percentile(cancel, 0.99):.1f} | {max(cancel):.1f} | '
            f'{sum(g > 50 for g in goal)} / {sum(c > 50 for c in cancel)} | '
            f'{statistics.median(period):.2f}, {min(period):.2f}-{max(period):.2f} | '
            f'{statistics.median(speeds) if speeds else float("nan"):.1f} |')
    return '\n'.join(lines) + '\n'


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--pairs', type=int, default=150, help='goal+cancel pairs per block')
    parser.add_argument('--blocks', type=int, default=2, help='blocks per variant')
    parser.add_argument('--variants', default='switch-1ms,switch-5ms')
    parser.add_argument('--out', default='benchmarks/results/reliability')
    parser.add_argument('--report', metavar='JSON', help='only re-make the table from a JSON')
    args = parser.parse_args(argv)
    if args.report:
        text = _report(json.loads(pathlib.Path(args.report).read_text()))
        pathlib.Path(args.report).with_suffix('.md').write_text(text)
        print(text)
        return 0
    from timebill_ros.bench.server_process import stop_server
    from timebill_ros.ros.client import client_session
    folder = pathlib.Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    pathlib.Path('log').mkdir(exist_ok=True)
    blocks = []
    for block in range(args.blocks):
        for variant in args.variants.split(','):
            node_name = f'resp_{variant.replace("-", "_")}_{block}'
            proc = _start(variant, pathlib.Path('log') / f'{node_name}.log', node_name)
            try:
                with client_session(f'/{node_name}/instruct', f'{node_name}_client') as client:
                    if not client.wait_for_server(600):
                        raise RuntimeError(f'{node_name} did not come up')
                    rows, periods, speeds = _measure_block(client, args.pairs, node_name)
            finally:
                stop_server(proc)
            blocks.append({'variant': variant, 'block': block, 'rows': rows,
                           'diag_periods_s': periods, 'tokens_per_s': speeds})
            print(f'{node_name}: {len(rows)} pairs, {len(speeds)} long answers', flush=True)
    (folder / 'responsiveness.json').write_text(json.dumps(blocks, indent=1))
    text = _report(blocks)
    (folder / 'responsiveness.md').write_text(text)
    print(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
