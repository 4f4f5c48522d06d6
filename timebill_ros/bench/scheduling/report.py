"""The scheduling benchmark's outputs: the markdown report, the plot, the calibration report."""

import json
import pathlib

from timebill_ros.bench.scheduling.capacity import CALIBRATION_MAPE_PCT, CAPACITY_BUDGET_S
from timebill_ros.bench.scheduling.metrics import summarize

# (key, column header, format) of the per-subset tables.
METRICS = (('miss_rate', 'miss rate', '{:.2f}'),
           ('miss_rate_short', 'miss rate short', '{:.2f}'),
           ('completion_rate', 'completed', '{:.2f}'),
           ('resp_mean_done', 'resp mean (done) s', '{:.2f}'),
           ('resp_p95_done', 'resp p95 (done) s', '{:.2f}'),
           ('resp_max_done', 'resp max (done) s', '{:.2f}'),
           ('resp_mean_all', 'resp mean (all) s', '{:.2f}'),
           ('resp_p95_all', 'resp p95 (all) s', '{:.2f}'),
           ('resp_max_all', 'resp max (all) s', '{:.2f}'),
           ('throughput_per_min', 'done / min', '{:.1f}'),
           ('queue_wait_mean', 'queue wait (ran) s', '{:.2f}'),
           ('sched_overhead_ms', 'sched overhead ms', '{:.3f}'),
           ('sched_overhead_pct', 'sched overhead % of e2e', '{:.4f}'),
           ('admission_predict_ms', 'u_J predict ms', '{:.0f}'),
           ('offloaded', 'offloaded', '{:.2f}'),
           ('batched', 'batched', '{:.2f}'))


def _fmt(pair, fmt):
    mean, sd = pair
    if mean is None:
        return ''
    return fmt.format(mean) + ('' if sd is None else ' ± ' + fmt.format(sd))


_OVERRUN_TEXT = {'kill': 'Kill',
                 'skip_next': 'Skip-Next (a running goal finishes late; queued goals that '
                              'come due meanwhile are SKIPPED)'}
_BASIS_TEXT = {'model': 't^_e2e (calibration)',
               'service': 'the service fit (scale x t^_e2e + overhead)'}


def report(data):
    """Return the markdown report of a run (the dict saved as ``schedbench_raw.json``)."""
    meta = data['meta']
    table = summarize(data['rows'])
    lines = ['# Scheduling benchmark (RT-LM Sec. V, adapted)', '',
             f'Command: `{meta["command"]}`', '',
             f'Run {meta.get("started", "?")}, {meta.get("runtime_s", 0) / 60:.1f} min; '
             f'seed {meta["seed"]}; {meta["repeats"]} repeat(s) a cell (values: mean ± sample '
             f'sd over repeats); overrun policy {_OVERRUN_TEXT[meta.get("overrun", "kill")]}; '
             'N_max '
             f'{meta["n_max"]}; budget = {_BASIS_TEXT[meta.get("budget_basis", "model")]} '
             f'x slack, slack uniform in [{meta["slack"][0]}, {meta["slack"][1]}]; Poisson '
             'arrivals at load x capacity.',
             '', 'A goal misses unless COMPLETED with deadline_met. Response time = receipt '
             'to result (total_time): "done" over completed goals, "all" over every goal. '
             '"short": goals whose measured response length is below their subset\'s median. '
             'Throughput: completed goals per minute over the makespan (first send to last '
             'result). Queue wait: goals that started running. Sched overhead: the '
             'scheduler\'s choices (schedule_time), mean ms a goal and as % of the summed '
             'response times; u_J predict: the length prediction at admission that the run '
             'reused (not an overhead: each goal is predicted once either way). offloaded: '
             'share of the goals that ran on the offload executor. batched: share of the goals '
             'that ran in a decoding batch of two or more (scheduler.consolidation).', '']
    ran = ', '.join(meta['methods']) or 'none'
    lines.append(f'Methods run: {ran}.')
    for name, why in meta.get('skipped', {}).items():
        lines.append(f'Skipped {name}: {why}')
    for name, note in meta.get('notes', {}).items():
        lines.append(f'Note on {name}: {note}')
    lines += ['', f'## Workload subsets ({meta["pool"]})', '',
              '| subset | goals | N mean | N sd | N min-max | capped | short | N_x mean (max) '
              '| t^_e2e mean s | sample measured s | measured / t^ | service fit '
              '| capacity goals/s |', '|' + '---|' * 13]
    for name, sub in meta['subsets'].items():
        st, cap = sub['stats'], sub.get('capacity')
        measured = (f'{cap["sample_measured_mean_s"]:.2f} | {cap["ratio"]:.2f} | '
                    f'{cap["scale"]:.2f} t^ + {cap["overhead_s"]:.2f} s | '
                    f'{cap["capacity_per_s"]:.3f}') if cap else ' | | | '
        lines.append(
            f'| {name} | {st["goals"]} | {st["mean"]:.1f} | {st["std"]:.1f} | '
            f'{st["min"]}-{st["max"]} | {st["capped"]} | {st["short"]} | '
            f'{st["prompt_mean"]:.0f} ({st["prompt_max"]}) | '
            f'{sub["predicted_mean_s"]:.2f} | {measured} |')
    lines += ['', 'Capacity = 1 / the mean over the subset of its service fit (measured = '
              'scale x t^_e2e + overhead, least squares over the sample; overhead 0 when the '
              f'sample\'s t^ are too alike): the sample ({meta["capacity_sample"]} goals spread '
              'over the subset\'s predicted times) ran one at a time with a '
              f'{CAPACITY_BUDGET_S:.0f} s budget on the {meta.get("capacity_method", "?")} '
              'server.']
    for subset in meta['subsets']:
        entries = [e for e in table if e['subset'] == subset]
        if not entries:
            continue
        lines += ['', f'## Subset {subset}', '',
                  '| load | method | ' + ' | '.join(h for _, h, _ in METRICS) + ' |',
                  '|' + '---|' * (len(METRICS) + 2)]
        for e in entries:
            lines.append(f'| {e["load"]:.2f} | {e["method"]} | '
                         + ' | '.join(_fmt(e[k], f) for k, _, f in METRICS) + ' |')
        missing = sum(e['no_result'][0] or 0 for e in entries)
        if missing:
            lines.append(f'\n{missing:.0f} goal(s) a repeat on average got no result '
                         '(not accepted or timed out); they count as misses.')
    if meta.get('send_lag_max_s') is not None:
        lines += ['', f'Largest lag of a goal\'s send behind its arrival time: '
                  f'{meta["send_lag_max_s"] * 1e3:.0f} ms.']
    fit = meta.get('calibration_fit_pct')
    if fit is not None and fit > CALIBRATION_MAPE_PCT:
        lines += ['', f'**Warning:** the calibration\'s held-out MAPE is {fit:.0f} % (> '
                  f'{CALIBRATION_MAPE_PCT:.0f} %): the machine was busy while profiling, '
                  'the time model is off by the measured / t^ ratio above.']
    lines += ['', 'Time model (ETE) fit, shared by all servers:', '```',
              meta.get('calibration_report', ''), '```']
    return '\n'.join(lines) + '\n'


def plot(data, path):
    """Write miss rate (top) and throughput (bottom) vs load: a column per subset, a line a method.

    Error bars are the sample sd over repeats; throughput is completed goals per minute.
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    table = summarize(data['rows'])
    subsets = [s for s in data['meta']['subsets'] if any(e['subset'] == s for e in table)]
    fig, axes = plt.subplots(2, max(1, len(subsets)), figsize=(5 * max(1, len(subsets)), 7),
                             squeeze=False, sharex=True)
    for column, subset in enumerate(subsets):
        methods = []
        for e in table:
            if e['subset'] == subset and e['method'] not in methods:
                methods.append(e['method'])
        for row, key in enumerate(('miss_rate', 'throughput_per_min')):
            axis = axes[row][column]
            for method in methods:
                pts = [(e['load'], *e[key]) for e in table
                       if e['subset'] == subset and e['method'] == method
                       and e[key][0] is not None]
                axis.errorbar([p[0] for p in pts], [p[1] for p in pts],
                              yerr=[p[2] or 0.0 for p in pts], marker='o', capsize=3,
                              label=method)
        axes[0][column].set(title=f'{subset} variance', ylim=(-0.02, 1.02))
        axes[1][column].set(xlabel='offered load (x capacity)')
        axes[0][column].legend(fontsize=8)
    axes[0][0].set_ylabel('deadline-miss rate')
    axes[1][0].set_ylabel('completed goals / min')
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_outputs(data, out_dir, progress=print):
    """Write schedbench_raw.json, schedbench.md, schedbench.png and calibration.txt."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / 'schedbench_raw.json').write_text(json.dumps(data, indent=1))
    text = report(data)
    (out_dir / 'schedbench.md').write_text(text)
    (out_dir / 'calibration.txt').write_text(data['meta'].get('calibration_report', '') + '\n')
    if data['rows']:
        plot(data, out_dir / 'schedbench.png')
    progress(text)
    return text
