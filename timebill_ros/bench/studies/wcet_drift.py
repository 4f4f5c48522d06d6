"""WCET coverage on goals never seen, with a calibration at least 20 minutes old.

    timebill study wcet_drift --calibration CAL.yaml --out DIR [--min-age-s 1200]

Starts ``timebill serve`` (the node, as a robot runs it) on the given calibration with a fresh
online state, waits until the calibration is at least ``--min-age-s`` old, then:

1. **Admission through ROS**: infeasible Kill goals (long prompts, 0.05 s budgets; a short one
   with 1 ms) - time from sending the goal to receiving REJECTED, as the client sees it.
2. **Drift run**: held-out goals one after another - the RLP's test split (never trained on)
   and long robot logs - with ``max_new_tokens`` 256 and generous budgets. For each goal the
   execution time (total - queue time) is compared with two t^_WCETs of the same goal:
   the self-correcting one the server reports, and the fixed model's (the calibration's Eq. 9
   at the goal's N_x, alpha* and N^_W, as the server computed it before issue 9).

Writes DIR/<tag>.md, .json and .png (server log and online state: log/). Run it from the
repository root. ``--goal-set first`` is the run the estimator was chosen on (docs/deadlines.md),
``second`` (default) the goals it never saw.
"""

import argparse
import datetime
import json
import pathlib
import sys
import time

from timebill_ros.bench.studies.kill_latency import percentile  # one percentile for both

N_TEST_PROMPTS = 70
LOG_LINES = (60, 80, 100, 120, 140, 160, 180, 200, 90, 150)
SECOND_LOG_LINES = tuple(range(45, 201, 5))[:30]
INFEASIBLE = 20
N_MAX = 256


def _goals(goal_set):
    """Return [(name, prompt)]: RLP test-split prompts and long robot logs.

    ``first``: the first 70 test prompts (one category after another) and 10 logs;
    ``second``: the other test prompts and 30 logs of other lengths and seeds - goals the
    first run (used to choose the estimator) never saw.
    """
    from timebill_ros import prompts
    from timebill_ros.bench.timebill import rlp_test_prompts
    if goal_set == 'first':
        goals = rlp_test_prompts(N_TEST_PROMPTS)
        return goals + [(f'log{n}', prompts.long_prompt(n, seed=5000 + n)) for n in LOG_LINES]
    goals = rlp_test_prompts(10_000)[N_TEST_PROMPTS:]
    logs = [(f'log{n}b', prompts.long_prompt(n, seed=7000 + n)) for n in SECOND_LOG_LINES]
    # Interleave, so that long logs are spread over the run.
    step = max(1, len(goals) // len(logs))
    for i, log in enumerate(logs):
        goals.insert(min(len(goals), i * (step + 1)), log)
    return goals


def _params(calibration, state_file):
    from timebill_ros import params
    from timebill_ros.config import EngineConfig, ServerConfig, TimingConfig
    config = ServerConfig(engine=EngineConfig(max_new_tokens=N_MAX),
                          timing=TimingConfig(calibration_file=str(calibration),
                                              state_file=str(state_file)))
    path = pathlib.Path('log') / 'wcet_drift_params.yaml'
    path.write_text(params.to_yaml(config))
    return str(path)


def _age_s(calibration):
    created = datetime.datetime.fromisoformat(calibration.created)
    return (datetime.datetime.now(datetime.timezone.utc) - created).total_seconds()


def _admission(client):
    """Send infeasible goals; return [{ms, status, infeasible, prefill_s, message}]."""
    from timebill_ros import prompts
    from timebill_ros.ros.client import make_goal
    from timebill_ros.ros.conversions import duration_to_s
    from timebill_ros.server.status import POLICY_KILL
    rows = []
    for i in range(INFEASIBLE):
        prompt = (prompts.SHORT[0][1] if i == 0 else prompts.long_prompt(60 + 7 * i, seed=i))
        budget = 0.001 if i == 0 else 0.05
        start = time.monotonic()
        result, _ = client.run(make_goal(prompt, budget_s=budget, max_new_tokens=64,
                                         policy=POLICY_KILL))
        rows.append({'ms': (time.monotonic() - start) * 1e3, 'status': result.status,
                     'infeasible': result.infeasible, 'n_x': result.prompt_tokens,
                     'min_time_s': duration_to_s(result.min_time), 'budget_s': budget,
                     'prefill_s': duration_to_s(result.prefill_time),
                     'message': result.message})
    return rows


def _drift(client, coefficients, goals):
    from timebill_ros.ros.client import make_goal
    from timebill_ros.ros.conversions import duration_to_s
    from timebill_ros.server.status import POLICY_KILL
    rows = []
    for i, (name, prompt) in enumerate(goals):
        budget = 600.0
        result, _ = client.run(make_goal(prompt, budget_s=budget, max_new_tokens=N_MAX,
                                         policy=POLICY_KILL), timeout_s=900.0)
        exec_s = duration_to_s(result.total_time) - duration_to_s(result.queue_time)
        fixed = coefficients.e2e_s(result.prompt_tokens, float(result.eviction_ratio),
                                   max(1, result.pessimistic_tokens))
        row = {'name': name, 'status': result.status, 'n_x': result.prompt_tokens,
               'n_hat': result.predicted_tokens, 'n_w': result.pessimistic_tokens,
               'n': result.response_tokens, 'alpha': float(result.eviction_ratio),
               'exec_s': exec_s, 'wcet_self_s': duration_to_s(result.predicted_wcet),
               'wcet_fixed_s': fixed, 'prefill_s': duration_to_s(result.prefill_time),
               'decode_s': duration_to_s(result.decode_time),
               'predict_s': duration_to_s(result.predict_time), 'predictor': result.predictor}
        rows.append(row)
        print(f'[{i + 1}/{len(goals)}] {name:22s} N_x={row["n_x"]:5d} N^={row["n_hat"]:3d} '
              f'N={row["n"]:3d} exec {exec_s:6.2f} s  WCET self {row["wcet_self_s"]:6.2f} '
              f'fixed {fixed:6.2f}', flush=True)
    return rows


def summarize(rows):
    """Return {model: {over, share, ratio_mean, ratio_min}} over the COMPLETED rows."""
    from timebill_ros.server.status import COMPLETED
    done = [r for r in rows if r['status'] == COMPLETED]
    out = {}
    for model in ('fixed', 'self'):
        over = [r for r in done if r['exec_s'] > r[f'wcet_{model}_s']]
        ratios = [r[f'wcet_{model}_s'] / r['exec_s'] for r in done]
        out[model] = {'goals': len(done), 'over': len(over), 'share': len(over) / len(done),
                      'ratio_mean': sum(ratios) / len(ratios), 'ratio_min': min(ratios),
                      'ratio_max': max(ratios)}
    return out


def _warm_up_line(log_path):
    """Return the server's warm-up log line (what the speed factors started from)."""
    for line in pathlib.Path(log_path).read_text(errors='replace').splitlines():
        if 'time model warm-up' in line:
            return line.split(']: ', 1)[-1]
    return 'no warm-up line in the server log'


def _report(folder, tag, age_s, admission, rows, started, warm_up):
    from timebill_ros.server.status import REJECTED
    summary = summarize(rows)
    waits = [r['ms'] for r in admission]
    lines = [
        f'Calibration age when the drift run started: {age_s / 60:.1f} min. '
        f'{len(rows)} held-out goals, max_new_tokens {N_MAX}, generous budgets '
        f'({time.strftime("%Y-%m-%d %H:%M", time.gmtime(started))} UTC).', '',
        '| t^_WCET | goals | exec > WCET | share | mean WCET / exec | min | max |',
        '|---|---|---|---|---|---|---|']
    names = {'fixed': 'fixed model (calibration, Eq. 9; before issue 9)',
             'self': 'self-correcting (speed factors + learned margin)'}
    for model, s in summary.items():
        lines.append(f"| {names[model]} | {s['goals']} | {s['over']} | {s['share']:.1%} | "
                     f"{s['ratio_mean']:.2f} | {s['ratio_min']:.2f} | {s['ratio_max']:.2f} |")
    refused = [r for r in admission if r['status'] == REJECTED and r['infeasible']]
    lines += ['', f'Admission through ROS: {len(refused)} of {len(admission)} infeasible '
              f'goals REJECTED; send -> result p50 {percentile(waits, 0.5):.1f} ms, max '
              f'{max(waits):.1f} ms; prefill time of every refused goal: '
              f"{max(r['prefill_s'] for r in admission):.3f} s (the model never ran).",
              f"Example: {admission[-1]['message']}", f'Server: {warm_up}.']
    text = '\n'.join(lines) + '\n'
    (folder / f'{tag}.md').write_text(text)
    (folder / f'{tag}.json').write_text(json.dumps(
        {'age_s': age_s, 'summary': summary, 'warm_up': warm_up, 'admission': admission,
         'goals': rows}, indent=1))
    _plot(rows, folder / f'{tag}.png')
    print(text)


def _plot(rows, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from timebill_ros.server.status import COMPLETED
    done = [r for r in rows if r['status'] == COMPLETED]
    fig, ax = plt.subplots(figsize=(9, 4))
    xs = range(1, len(done) + 1)
    for model, style in (('fixed', 'x'), ('self', 'o')):
        ax.plot(xs, [r[f'wcet_{model}_s'] / r['exec_s'] for r in done], style,
                label=f't^_WCET / t_exec, {model}', ms=4)
    ax.axhline(1.0, color='red', lw=1)
    ax.set_xlabel('goal (in the order run)')
    ax.set_ylabel('t^_WCET / actual execution time')
    ax.set_title('below the red line: the goal ran longer than its t^_WCET')
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--calibration', required=True)
    parser.add_argument('--out', default='benchmarks/results/deadlines')
    parser.add_argument('--min-age-s', type=float, default=1200.0)
    parser.add_argument('--goals', type=int, default=0, help='run only the first N goals')
    parser.add_argument('--goal-set', choices=('first', 'second'), default='second')
    parser.add_argument('--tag', default='wcet_drift', help='output file names')
    args = parser.parse_args(argv)
    from timebill_ros.bench.server_process import served
    from timebill_ros.timing.model import Calibration
    folder = pathlib.Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    calibration = Calibration.load(args.calibration)
    pathlib.Path('log').mkdir(exist_ok=True)
    state_file = pathlib.Path('log') / 'wcet_drift.online.yaml'
    state_file.unlink(missing_ok=True)
    goals = _goals(args.goal_set)[:args.goals or None]
    wait_s = args.min_age_s - _age_s(calibration)
    if wait_s > 0:
        print(f'calibration is {_age_s(calibration) / 60:.1f} min old; waiting '
              f'{wait_s / 60:.1f} min', flush=True)
        time.sleep(wait_s)
    server_log = pathlib.Path('log') / f'{args.tag}_server.log'
    with served(_params(args.calibration, state_file), server_log) as client:
        admission = _admission(client)
        started = time.time()
        age_s = _age_s(calibration)
        rows = _drift(client, calibration.coefficients, goals)
    _report(folder, args.tag, age_s, admission, rows, started, _warm_up_line(server_log))
    return 0


if __name__ == '__main__':
    sys.exit(main())
