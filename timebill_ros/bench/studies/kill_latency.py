"""Kill and cancel latency, before and after: the same goals through two versions of the core.

    timebill study kill_latency plan   --out DIR          # goals.json from the calibration
    timebill study kill_latency run    --out DIR --label after
    PYTHONPATH=<old tree> python bench/studies/kill_latency.py run --out DIR --label before
    timebill study kill_latency report --out DIR          # kill_latency.md / .json / .png

``benchmarks/deadlines.sh`` runs all of it. ``run`` imports whichever ``timebill_ros`` is on
the path (this script adapts to the module layout before and after issue 9), builds the
server core as the node does (``factory.build_service``: real model, the cached calibration,
the ONNX RLP), and submits the goals one at a time, Kill policy. Each goal's timeline (start,
end of prefill, start of decoding, terminal callback) is read on the service clock, and a
forward hook on the model counts forward passes per goal. Kill goals: latency = terminal time
- deadline (< 0: ended before its deadline: refused at admission or stopped early). Cancel
goals: terminal time - the moment service.cancel() was called. "Phase" is where the goal was
at min(deadline or cancel, terminal time). The bar (issue 9): overshoot p99 <= one measured
decoding step + 20 ms and max <= two steps, per phase; steps are measured at the start of
each run at several cache lengths and interpolated at each goal's N_x.
"""

import argparse
import bisect
import json
import pathlib
import random
import sys
import threading
import time

KILL, CANCEL = 'kill', 'cancel'
TARGETS = {'prefill': 100, 'eviction': 60, 'decode': 80}
N_CANCEL = 100
STEP_LENGTHS = (64, 512, 1024, 2048, 3584)
LINES = (0, 2, 4, 8, 15, 25, 40, 60, 90, 130, 170, 200)  # robot-log lines: ~30-3600 tokens
GOAL_TIMEOUT_S = 180.0


# --- plan ----------------------------------------------------------------------------------
def prompt_of(index, log_lines):
    """Return goal ``index``'s prompt: a short robot instruction, or a robot-log summary."""
    from timebill_ros import prompts
    if log_lines == 0:
        return prompts.SHORT[index % len(prompts.SHORT)][1]
    return prompts.long_prompt(log_lines, seed=1000 + index)


def plan(out, seed=0):
    """Write DIR/goals.json: prompt recipes, budgets, cancel times from the calibration."""
    from timebill_ros.config import EngineConfig, TimingConfig
    from timebill_ros.engine import LlmEngine
    from timebill_ros.config import EvictionConfig
    from timebill_ros.timing.startup import load_or_calibrate
    engine = LlmEngine.load(EngineConfig(), EvictionConfig())
    calibration = load_or_calibrate(engine, EngineConfig(), TimingConfig(), log=print)
    co = calibration.coefficients
    rng = random.Random(seed)
    goals = []
    kinds = [(t, KILL) for t, n in TARGETS.items() for _ in range(n)]
    kinds += [('cancel', CANCEL)] * N_CANCEL
    for i, (target, kind) in enumerate(kinds):
        lines = rng.choice(LINES)
        n_x = len(engine.encode(prompt_of(i, lines)))
        t_pre, step = co.prefill_s(n_x), co.decode_step_s(n_x)
        goal = {'index': i, 'target': target, 'kind': kind, 'log_lines': lines, 'n_x': n_x,
                'max_new_tokens': 128, 'calibrated_prefill_s': t_pre}
        if target == 'prefill':
            goal['budget_s'] = rng.uniform(0.5, 1.05) * t_pre
        elif target == 'eviction':
            goal['budget_s'] = rng.uniform(0.95, 1.15) * t_pre + rng.uniform(0.0, 0.1)
        elif target == 'decode':
            goal['budget_s'] = t_pre + rng.uniform(1.0, 20.0) * step
        else:
            goal['budget_s'] = 600.0
            goal['cancel_after_s'] = rng.uniform(0.0, t_pre + 20.0 * step)
        goals.append(goal)
    rng.shuffle(goals)
    path = pathlib.Path(out) / 'goals.json'
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({'calibration': calibration.created, 'seed': seed,
                                'goals': goals}, indent=1))
    print(f'wrote {len(goals)} goals to {path}')


# --- run -----------------------------------------------------------------------------------
def _core():
    """Return (status, GoalRequest, build_service, params) of the timebill_ros on the path."""
    from timebill_ros import params
    from timebill_ros.server import status
    from timebill_ros.server.factory import build_service
    from timebill_ros.server.goals import GoalRequest
    return status, GoalRequest, build_service, params


def _measure_steps(engine):
    """Return [(n_kv, seconds)]: one decoding step measured at STEP_LENGTHS."""
    from timebill_ros.timing.probes import EngineProbes
    probes = EngineProbes(engine)
    probes.measure_decode_step_s(64, steps=4)  # warm-up
    return [(n, probes.measure_decode_step_s(n, steps=8)) for n in STEP_LENGTHS]


def step_at(steps, n_kv):
    """Interpolate the measured step seconds at ``n_kv`` cached tokens."""
    lengths = [n for n, _ in steps]
    i = min(max(bisect.bisect_left(lengths, n_kv), 1), len(steps) - 1)
    (n0, t0), (n1, t1) = steps[i - 1], steps[i]
    return t0 + (t1 - t0) * (n_kv - n0) / (n1 - n0)


class _Goal:
    """Bookkeeping of one submitted goal on the service clock."""

    def __init__(self, clock):
        self.clock = clock
        self.timeline = []
        self.done = threading.Event()
        self.result = None
        self.end_s = None

    def on_feedback(self, feedback):
        self.timeline.append((int(feedback.phase), self.clock()))

    def on_done(self, result):
        self.end_s = self.clock()
        self.result = result
        self.done.set()


def _forward_counter(engine):
    """Return a callable giving the model's forward passes so far.

    The engine counts them (any forward pass); trees from before that count hook the model.
    """
    if hasattr(engine, 'n_forward_passes'):
        return lambda: engine.n_forward_passes
    calls = [0]

    def count(module, args, kwargs):
        calls[0] += 1

    engine.model.register_forward_pre_hook(count, with_kwargs=True)
    return lambda: calls[0]


def _run_goal(service, status, GoalRequest, goal, forward_calls):
    clock = service.clock
    rec = _Goal(clock)
    request = GoalRequest(prompt_of(goal['index'], goal['log_lines']), budget_s=goal['budget_s'],
                          max_new_tokens=goal['max_new_tokens'],
                          overrun_policy=status.POLICY_KILL)
    calls_before = forward_calls()
    submitted = clock()
    job = service.submit(request, rec.on_feedback, rec.on_done, received_s=submitted)
    cancel_at = None
    if goal['kind'] == CANCEL and job is not None:
        wake = submitted + goal['cancel_after_s']
        while not rec.done.wait(max(0.0, min(0.01, wake - clock()))) and clock() < wake:
            pass
        if not rec.done.is_set():
            cancel_at = clock()
            service.cancel(job)
    if not rec.done.wait(GOAL_TIMEOUT_S):
        raise RuntimeError(f'goal {goal["index"]} got no result')
    result = rec.result
    phases = {}
    for phase, at in rec.timeline:
        phases.setdefault(phase, at)
    start = phases.get(status.PHASE_PREFILL)
    prefill_end = start + result.prefill_time_s if start is not None and \
        result.prefill_time_s > 0 else None
    return {
        'index': goal['index'], 'target': goal['target'], 'kind': goal['kind'],
        'n_x': goal['n_x'], 'budget_s': goal['budget_s'], 'submitted_s': submitted,
        'deadline_s': submitted + goal['budget_s'], 'end_s': rec.end_s,
        'cancel_s': cancel_at, 'start_s': start, 'prefill_end_s': prefill_end,
        'decode_start_s': phases.get(status.PHASE_DECODE),
        'status': result.status_name, 'message': result.message,
        'response_tokens': result.response_tokens, 'alpha': result.eviction_ratio,
        'forward_passes': forward_calls() - calls_before,
        'infeasible': bool(getattr(result, 'infeasible', False))}


def run(out, label, limit=0):
    """Run DIR/goals.json with the timebill_ros on the path; write DIR/<label>.json.

    Run it from the repository root (the online state goes to log/).
    """
    status, GoalRequest, build_service, params = _core()
    goals = json.loads((pathlib.Path(out) / 'goals.json').read_text())['goals']
    goals = goals[:limit] if limit else goals
    flat = {'engine.max_new_tokens': 128}
    state_file = str(pathlib.Path('log') / f'kill_latency_{label}.online.yaml')
    if 'timing.state_file' in params.defaults():  # after issue 9: a fresh online state
        flat['timing.state_file'] = state_file
        pathlib.Path(state_file).unlink(missing_ok=True)
    config = params.config_from_flat(flat)
    service = build_service(config, log=print)
    steps = _measure_steps(service.engine)
    print(f'{label}: decoding step ' + ', '.join(f'{t * 1e3:.1f} ms @{n}' for n, t in steps))
    forward_calls = _forward_counter(service.engine)
    service.start()
    rows = []
    started = time.monotonic()
    try:
        for i, goal in enumerate(goals):
            row = _run_goal(service, status, GoalRequest, goal, forward_calls)
            row['step_s'] = step_at(steps, goal['n_x'])
            rows.append(row)
            latency = row['end_s'] - (row['cancel_s'] or row['deadline_s'])
            print(f'[{i + 1}/{len(goals)}] {label} {goal["target"]:8s} N_x={goal["n_x"]:5d} '
                  f'{row["status"]:9s} latency {latency * 1e3:+8.1f} ms  {row["message"]}',
                  flush=True)
            time.sleep(0.2)  # let the predictor thread settle between goals
    finally:
        service.shutdown()
    path = pathlib.Path(out) / f'{label}.json'
    path.write_text(json.dumps({'label': label, 'steps': steps, 'rows': rows,
                                'wall_s': time.monotonic() - started}, indent=1))
    print(f'wrote {path}')


# --- report --------------------------------------------------------------------------------
def phase_of(row):
    """Return the phase the goal was in at the earlier of its deadline (or cancel) and end."""
    if row['start_s'] is None:
        return 'admission' if row['status'] == 'REJECTED' else 'queue'
    moment = min(row['end_s'], row['cancel_s'] or row['deadline_s'])
    if row['prefill_end_s'] is None or moment < row['prefill_end_s']:
        return 'prefill'
    if row['decode_start_s'] is None or moment < row['decode_start_s']:
        return 'predictor/eviction'
    return 'decode'


def latency_s(row):
    """Return the terminal time minus the deadline (kill) or cancel time (cancel), s."""
    return row['end_s'] - (row['cancel_s'] if row['kind'] == CANCEL else row['deadline_s'])


def percentile(values, q):
    """Return the q-quantile of ``values`` by the upper nearest rank (nan when empty)."""
    values = sorted(values)
    if not values:
        return float('nan')
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.999999))]


def stopped(row):
    """Return True for the rows that count: goals ended by Kill, admission or cancel."""
    if row['kind'] == CANCEL:
        return row['cancel_s'] is not None
    return row['status'] in ('KILLED', 'REJECTED')


def summarize(rows, group_of):
    """Return {group: stats} over the stopped rows."""
    groups = {}
    for row in rows:
        if stopped(row):
            groups.setdefault(group_of(row), []).append(row)
    table = {}
    for group, items in sorted(groups.items()):
        lat = [latency_s(r) for r in items]
        over = [max(0.0, x) for x in lat]
        table[group] = {
            'n': len(items), 'early': sum(x < 0 for x in lat),
            'p50_ms': percentile(over, 0.5) * 1e3, 'p99_ms': percentile(over, 0.99) * 1e3,
            'max_ms': max(over) * 1e3,
            'step_ms': percentile([r['step_s'] for r in items], 0.5) * 1e3,
            'over_bound': sum(o > r['step_s'] + 0.020 for o, r in zip(over, items)),
            'over_2_steps': sum(o > 2 * r['step_s'] for o, r in zip(over, items)),
            'signed_p50_ms': percentile(lat, 0.5) * 1e3}
    return table


def _table(title, runs, group_of):
    lines = [f'**{title}** (overshoot = max(0, latency); "early": ended before its '
             'deadline; "> bound": overshoot above that goal\'s measured step + 20 ms)', '',
             '| phase | run | goals | early | overshoot p50 ms | p99 ms | max ms | '
             'step ms (median) | > bound | > 2 steps | signed p50 ms |',
             '|---|---|---|---|---|---|---|---|---|---|---|']
    summaries = {label: summarize(data['rows'], group_of) for label, data in runs.items()}
    phases = sorted({p for s in summaries.values() for p in s})
    for phase in phases:
        for label, summary in summaries.items():
            s = summary.get(phase)
            if s is None:
                continue
            lines.append(
                f"| {phase} | {label} | {s['n']} | {s['early']} | {s['p50_ms']:.1f} | "
                f"{s['p99_ms']:.1f} | {s['max_ms']:.1f} | {s['step_ms']:.1f} | "
                f"{s['over_bound']} | {s['over_2_steps']} | {s['signed_p50_ms']:+.1f} |")
    return lines, summaries


def _admission_lines(runs):
    lines = ['', '**Admission** (goals refused before any model work):', '',
             '| run | refused | submit -> REJECTED p50 ms | p99 ms | max ms | '
             'forward passes of refused goals |', '|---|---|---|---|---|---|']
    for label, data in runs.items():
        refused = [r for r in data['rows'] if r['status'] == 'REJECTED']
        if not refused:
            lines.append(f'| {label} | 0 | - | - | - | - |')
            continue
        waits = [(r['end_s'] - r['submitted_s']) * 1e3 for r in refused]
        lines.append(f'| {label} | {len(refused)} | {percentile(waits, 0.5):.2f} | '
                     f'{percentile(waits, 0.99):.2f} | {max(waits):.2f} | '
                     f'{sum(r["forward_passes"] for r in refused)} |')
    return lines


def _outcomes(runs):
    lines = ['', '**How the goals ended**', '', '| run | kind | ' + ' | '.join(
        ['COMPLETED', 'KILLED (early)', 'KILLED (at/after deadline)', 'REJECTED',
         'CANCELED', 'other']) + ' | wall s |', '|---|---|---|---|---|---|---|---|---|']
    for label, data in runs.items():
        for kind in (KILL, CANCEL):
            rows = [r for r in data['rows'] if r['kind'] == kind]
            counts = [sum(r['status'] == 'COMPLETED' for r in rows),
                      sum(r['status'] == 'KILLED' and latency_s(r) < 0 for r in rows),
                      sum(r['status'] == 'KILLED' and latency_s(r) >= 0 for r in rows),
                      sum(r['status'] == 'REJECTED' for r in rows),
                      sum(r['status'] == 'CANCELED' for r in rows)]
            counts.append(len(rows) - sum(counts))
            lines.append(f'| {label} | {kind} | ' + ' | '.join(map(str, counts))
                         + f" | {data['wall_s']:.0f} |")
    return lines


def _paired(runs):
    """Compare the same kill goals across runs: on time before, refused or stopped after."""
    if set(runs) != {'before', 'after'}:
        return []
    before = {r['index']: r for r in runs['before']['rows'] if r['kind'] == KILL}
    after = {r['index']: r for r in runs['after']['rows'] if r['kind'] == KILL}
    both = sorted(set(before) & set(after))

    def on_time(row):
        return row['status'] == 'COMPLETED' and row['end_s'] <= row['deadline_s']

    lost = [i for i in both if on_time(before[i]) and not on_time(after[i])]
    won = [i for i in both if on_time(after[i]) and not on_time(before[i])]
    lines = ['', f'**Same kill goals, paired** ({len(both)}): completed on time before but '
             f'not after: {len(lost)}; after but not before: {len(won)}.']
    for i in lost:
        took_s = before[i]['end_s'] - before[i]['submitted_s']
        lines.append(f"- goal {i} (N_x {after[i]['n_x']}, budget {after[i]['budget_s']:.2f} s): "
                     f"before {before[i]['status']} in {took_s:.2f} s; "
                     f"after {after[i]['status']}: {after[i]['message']}")
    return lines


def report(out):
    """Write kill_latency.md / .json / .png from DIR/before.json and DIR/after.json."""
    folder = pathlib.Path(out)
    runs = {label: json.loads((folder / f'{label}.json').read_text())
            for label in ('before', 'after') if (folder / f'{label}.json').exists()}
    kill = {k: {**v, 'rows': [r for r in v['rows'] if r['kind'] == KILL]}
            for k, v in runs.items()}
    cancel = {k: {**v, 'rows': [r for r in v['rows'] if r['kind'] == CANCEL]}
              for k, v in runs.items()}
    lines = []
    text, kill_phase = _table('Kill, by the phase the goal was in at its deadline', kill,
                              phase_of)
    lines += text + ['']
    text, kill_target = _table('Kill, by the phase the budget aimed at (same goals in both '
                               'runs)', kill, lambda r: r['target'])
    lines += text + ['']
    text, cancel_phase = _table('Cancel, by the phase the goal was in when canceled', cancel,
                                phase_of)
    lines += text + _admission_lines(runs) + _outcomes(runs) + _paired(runs)
    steps = {label: data['steps'] for label, data in runs.items()}
    lines += ['', 'Measured decoding step (ms) at N_kv: ' + '; '.join(
        f'{label}: ' + ', '.join(f'{t * 1e3:.1f} @{n}' for n, t in s)
        for label, s in steps.items())]
    text = '\n'.join(lines) + '\n'
    (folder / 'kill_latency.md').write_text(text)
    (folder / 'kill_latency.json').write_text(json.dumps(
        {'kill_by_phase': kill_phase, 'kill_by_target': kill_target,
         'cancel_by_phase': cancel_phase}, indent=1))
    _plot(runs, folder / 'kill_latency.png')
    print(text)


def _plot(runs, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, kind in zip(axes, (KILL, CANCEL)):
        for label, data in runs.items():
            rows = [r for r in data['rows'] if r['kind'] == kind and stopped(r)]
            values = sorted(latency_s(r) * 1e3 for r in rows)
            if values:
                ax.plot(values, [(i + 1) / len(values) for i in range(len(values))],
                        label=f'{label} ({len(values)} goals)')
        ax.axvline(0, color='grey', lw=0.8)
        ax.set_xscale('symlog', linthresh=10)
        ax.set_xlabel('terminal time - ' + ('deadline' if kind == KILL else 'cancel')
                      + ' (ms, symlog)')
        ax.set_ylabel('share of goals')
        ax.set_title(f'{kind}: latency CDF')
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('step', choices=('plan', 'run', 'report'))
    parser.add_argument('--out', default='benchmarks/results/deadlines')
    parser.add_argument('--label', default='after')
    parser.add_argument('--limit', type=int, default=0, help='run only the first N goals')
    args = parser.parse_args(argv)
    if args.step == 'plan':
        plan(args.out)
    elif args.step == 'run':
        run(args.out, args.label, args.limit)
    else:
        report(args.out)
    return 0


if __name__ == '__main__':
    sys.exit(main())
