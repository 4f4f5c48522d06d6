"""Time from an infeasible Kill goal to its REJECTED result, through ROS, as a planner sees it.

    timebill study admission_latency [--goals 200] [--out benchmarks/results/deadlines]

1. **Collector pause** (its own process, no ROS): the server core is built as the node builds
   it (model, tokenizer, predictor); a full collection (``gc.collect()``) is timed with every
   object the build made still tracked, then after ``gc.freeze()``, which is what
   ``ros/node.py`` does once the node is up. A full collection on the node's threads holds
   every callback, REJECTED results included, for as long as it runs.
2. **Through ROS**: ``timebill serve`` as its own process; ``--goals`` infeasible Kill goals
   (robot logs of 10-199 lines, about 200-3900 tokens, with 0.05 s budgets; every tenth a
   short instruction with 1 ms), half while the server is idle and half while it decodes
   another goal (a second thread keeps one feasible goal running). For each: send -> result
   time, status, and the result's prefill time and answer length (both 0: the model never ran
   for it).

Writes DIR/admission.md and DIR/admission.json.
"""

import argparse
import gc
import json
import pathlib
import statistics
import subprocess
import sys
import threading
import time

from timebill_ros.bench.studies.kill_latency import percentile  # one percentile for both


def gc_child():
    """Build the server core; print JSON with full-collection times before/after a freeze."""
    from timebill_ros import params
    from timebill_ros.server.factory import build_service
    build_service(params.config_from_flat({}), log=lambda line: None)

    def collect_ms(rounds=5):
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            gc.collect()
            times.append((time.perf_counter() - start) * 1e3)
        return times

    tracked = len(gc.get_objects())
    before = collect_ms()
    gc.freeze()
    after = collect_ms()
    print(json.dumps({'tracked_objects': tracked, 'frozen': gc.get_freeze_count(),
                      'collect_ms': before, 'collect_frozen_ms': after}))


def _gc_pause():
    out = subprocess.run([sys.executable, __file__, '--gc-child'], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _infeasible_goal(i):
    from timebill_ros import prompts
    from timebill_ros.ros.client import make_goal
    from timebill_ros.server.status import POLICY_KILL
    if i % 10 == 0:
        return make_goal(prompts.SHORT[i % len(prompts.SHORT)][1], budget_s=0.001,
                         max_new_tokens=64, policy=POLICY_KILL), 0.001
    lines = 10 + (i * 37) % 190
    return make_goal(prompts.long_prompt(lines, seed=i), budget_s=0.05, max_new_tokens=64,
                     policy=POLICY_KILL), 0.05


def _keep_busy(client, stop):
    """Run feasible goals one after another until ``stop`` is set."""
    from timebill_ros import prompts
    from timebill_ros.ros.client import make_goal
    from timebill_ros.server.status import POLICY_SKIP_NEXT
    i = 0
    while not stop.is_set():
        client.run(make_goal(prompts.SHORT[i % len(prompts.SHORT)][1], budget_s=600.0,
                             max_new_tokens=256, policy=POLICY_SKIP_NEXT), timeout_s=900.0)
        i += 1


def _through_ros(client, n_goals):
    from timebill_ros.ros.conversions import duration_to_s
    rows = []
    stop = threading.Event()
    busy = threading.Thread(target=_keep_busy, args=(client, stop), daemon=True)
    for i in range(n_goals):
        if i == n_goals // 2:
            busy.start()
            time.sleep(2.0)  # the feasible goal is past its prefill and decoding
        goal, budget_s = _infeasible_goal(i)
        start = time.monotonic()
        result, _ = client.run(goal)
        rows.append({'ms': (time.monotonic() - start) * 1e3, 'busy': i >= n_goals // 2,
                     'status': result.status, 'infeasible': result.infeasible,
                     'n_x': result.prompt_tokens, 'budget_s': budget_s,
                     'min_time_s': duration_to_s(result.min_time),
                     'prefill_s': duration_to_s(result.prefill_time),
                     'tokens': result.response_tokens, 'message': result.message})
    stop.set()
    busy.join(timeout=900.0)
    return rows


def _report(gc_pause, rows):
    from timebill_ros.server.status import REJECTED
    lines = ['# Admission through ROS', '',
             'Command: `timebill study admission_latency`', '',
             '## Full-collection pause in the server process (ms, 5 collections each)', '',
             '| objects tracked after the build | gc.collect() median | max | '
             'after gc.freeze(): median | max |', '|---|---|---|---|---|',
             f"| {gc_pause['tracked_objects']:,} | "
             f"{statistics.median(gc_pause['collect_ms']):.1f} | "
             f"{max(gc_pause['collect_ms']):.1f} | "
             f"{statistics.median(gc_pause['collect_frozen_ms']):.1f} | "
             f"{max(gc_pause['collect_frozen_ms']):.1f} |", '',
             '## Send -> REJECTED result, infeasible Kill goals (ms)', '',
             '| server | goals | REJECTED infeasible | p50 | p99 | max | > 50 ms | '
             'model ran (prefill > 0 or tokens > 0) |', '|---|---|---|---|---|---|---|---|']
    for label, busy in (('idle', False), ('decoding another goal', True)):
        part = [r for r in rows if r['busy'] == busy]
        ms = [r['ms'] for r in part]
        lines.append(
            f"| {label} | {len(part)} | "
            f"{sum(r['status'] == REJECTED and r['infeasible'] for r in part)} | "
            f"{percentile(ms, 0.5):.1f} | {percentile(ms, 0.99):.1f} | {max(ms):.1f} | "
            f"{sum(m > 50.0 for m in ms)} | "
            f"{sum(r['prefill_s'] > 0 or r['tokens'] > 0 for r in part)} |")
    lines += ['', f"Example: {rows[-1]['message']}"]
    return '\n'.join(lines) + '\n'


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--goals', type=int, default=200)
    parser.add_argument('--out', default='benchmarks/results/deadlines')
    parser.add_argument('--report', metavar='JSON', help='only re-make the table from a '
                        'raw admission JSON (written next to it, .md)')
    parser.add_argument('--gc-child', action='store_true', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.gc_child:
        gc_child()
        return 0
    if args.report:
        raw = json.loads(pathlib.Path(args.report).read_text())
        text = _report(raw['gc'], raw['goals'])
        pathlib.Path(args.report).with_suffix('.md').write_text(text)
        print(text)
        return 0
    from timebill_ros import params
    from timebill_ros.config import ServerConfig
    from timebill_ros.bench.server_process import served
    gc_pause = _gc_pause()
    folder = pathlib.Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    pathlib.Path('log').mkdir(exist_ok=True)
    params_file = pathlib.Path('log') / 'admission_params.yaml'
    params_file.write_text(params.to_yaml(ServerConfig()))
    with served(str(params_file), pathlib.Path('log') / 'admission_server.log') as client:
        rows = _through_ros(client, args.goals)
    text = _report(gc_pause, rows)
    (folder / 'admission.md').write_text(text)
    (folder / 'admission.json').write_text(json.dumps({'gc': gc_pause, 'goals': rows},
                                                      indent=1))
    print(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
