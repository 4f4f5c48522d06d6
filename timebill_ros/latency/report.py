"""The latency report: tables (markdown, JSON) and the measured-vs-predicted plot."""

import json
import os

import numpy as np

from timebill_ros.latency.evaluate import (
    EXPONENTIAL, FSP, FULL_GRID, NONE, Method, Target, choose_probes, evaluate, mean_scores,
    score_model)
from timebill_ros.latency.estimators.base import model_from_coefficients
from timebill_ros.latency.estimators.linear import LinearRegression
from timebill_ros.latency.estimators.roofline import Roofline
from timebill_ros.latency.estimators.roofline_lr import RooflineRegression
from timebill_ros.latency.estimators.section_tps import SectionTps
from timebill_ros.latency.estimators.simfli_lm import SimFLiLinear
from timebill_ros.latency.estimators.simfli_sam import SimFLiSaturating
from timebill_ros.latency.estimators.timebill_ls import TimeBillLeastSquares

FEW_SHOT = 'few-shot Eq. 4 (`profile --few-shot`)'
REFERENCE = 'TimeBill LS, full grid (reference)'
PLOTTED = ('LR', 'Section-TPS', 'SimFLi (LM+SAM+FSP)', 'roofline-LR', FEW_SHOT, REFERENCE)


def methods(arch, hardware):
    """Return every compared method; all but the reference use five probes."""
    return [
        Method('roofline', Roofline(arch, hardware), NONE, hardware.measure_s),
        Method('roofline-LR', RooflineRegression(arch, hardware), EXPONENTIAL,
               hardware.measure_s),
        Method('LR', LinearRegression(), EXPONENTIAL),
        Method('Section-TPS', SectionTps(), EXPONENTIAL),
        Method('SimFLi (LM)', SimFLiLinear(), EXPONENTIAL),
        Method('SimFLi (LM+SAM)', SimFLiSaturating(), EXPONENTIAL),
        Method('SimFLi (LM+SAM+FSP)', SimFLiSaturating(), FSP),
        Method(FEW_SHOT, TimeBillLeastSquares(), EXPONENTIAL),
        Method(REFERENCE, TimeBillLeastSquares(), FULL_GRID),
    ]


def score_calibrations(calibrations, grid, design):
    """Score saved calibrations ({name: Calibration}) against the mean of every repeat."""
    target = Target.of(grid, design, grid.repeats)
    return {name: {'profiling_s': cal.profiling_s, 'method': cal.method,
                   'scores': score_model(model_from_coefficients(cal.coefficients), target,
                                         design, grid.n_out_max)}
            for name, cal in calibrations.items()}


def build(grid, design, arch, hardware, calibrations=None, k=5, seed=0, progress=None):
    """Return the report dict: per-method mean scores and costs, saved calibrations."""
    compared = methods(arch, hardware)
    results = evaluate(grid, design, compared, k=k, seed=seed, progress=progress)
    table = {}
    for method in compared:
        merged, cost = mean_scores(results, method.name)
        inputs = sorted({r.inputs for r in results if r.method == method.name})
        table[method.name] = {'scores': merged, 'cost_s': cost,
                              'inputs': [list(i) for i in inputs]}
    return {'meta': grid.meta, 'k': k, 'seed': seed, 'repeats': len(grid.repeats),
            'hardware': {'peak_gflops': hardware.peak_flops / 1e9,
                         'bandwidth_gbps': hardware.bandwidth_bps / 1e9,
                         'measure_s': hardware.measure_s},
            'methods': table,
            'calibrations': score_calibrations(calibrations or {}, grid, design)}


def _row(name, entry, split):
    s = entry['scores'][split]
    return (f"| {name} | {s['r2']:.4f} | {s['rmse']:.3f} | {s['mae']:.3f} | {s['mape']:.1f} | "
            f"{entry['cost_s']:.1f} |")


def _split_table(report, split):
    lines = ['| method | R^2 | RMSE s | MAE s | MAPE % | profiling s |',
             '|---|---|---|---|---|---|']
    lines += [_row(name, entry, split) for name, entry in report['methods'].items()]
    return lines


def ratios(report):
    """Return few-shot / full-grid ratios of all-cells MAPE, RMSE and profiling seconds."""
    few, ref = report['methods'][FEW_SHOT], report['methods'][REFERENCE]
    return {'mape': few['scores']['all']['mape'] / ref['scores']['all']['mape'],
            'rmse': few['scores']['all']['rmse'] / ref['scores']['all']['rmse'],
            'cost': ref['cost_s'] / few['cost_s']}


def markdown(report, design):
    """Return the report as markdown tables."""
    hw = report['hardware']
    out = [f"Grid: n_in {list(design.id_n_in)} (in-distribution) + "
           f"{list(design.heldout_n_in)} (held out); n_out {list(design.id_n_out)} + "
           f"{list(design.heldout_n_out)}; {report['repeats']} repeats; "
           f"{report['meta'].get('model_key')} on {report['meta'].get('device')} "
           f"{report['meta'].get('dtype')}. Measured PK {hw['peak_gflops']:.1f} GFLOP/s, "
           f"BW {hw['bandwidth_gbps']:.1f} GB/s ({hw['measure_s']:.1f} s).",
           '', f"Each method fitted on one repeat (k = {report['k']} probes unless noted), scored "
           'against the mean of the other repeats; mean over repeats.', '',
           '**In-distribution cells** (n_in <= 2048, n_out <= 64; like SimFLi Table 3):', '']
    out += _split_table(report, 'id')
    out += ['', '**Held-out cells** (n_in > 2048 or n_out > 64; like SimFLi Table 4):', '']
    out += _split_table(report, 'heldout')
    out += ['', '**All cells, and TimeBill\'s pieces** (MAPE %):', '',
            '| method | L MAPE | L RMSE s | t^_prefill MAPE | t^_decode-step MAPE |',
            '|---|---|---|---|---|']
    for name, entry in report['methods'].items():
        s = entry['scores']
        out.append(f"| {name} | {s['all']['mape']:.1f} | {s['all']['rmse']:.3f} | "
                   f"{s['prefill_mape']:.2f} | {s['step_mape']:.2f} |")
    r = ratios(report)
    out += ['', f"Few-shot vs full grid: all-cells MAPE x{r['mape']:.2f}, RMSE x{r['rmse']:.2f}, "
            f"at 1/{r['cost']:.1f} of the profiling time.", '']
    if report['calibrations']:
        out += ['**Saved calibrations** (measured live, scored against the mean of all '
                'repeats):', '',
                '| calibration | method | profiling s | L MAPE | L RMSE s | held-out L MAPE | '
                't^_prefill MAPE | t^_decode-step MAPE |', '|---|---|---|---|---|---|---|---|']
        for name, entry in report['calibrations'].items():
            s = entry['scores']
            out.append(f"| {name} | {entry['method']} | {entry['profiling_s']:.1f} | "
                       f"{s['all']['mape']:.1f} | {s['all']['rmse']:.3f} | "
                       f"{s['heldout']['mape']:.1f} | {s['prefill_mape']:.2f} | "
                       f"{s['step_mape']:.2f} |")
    inputs = {name: entry['inputs'] for name, entry in report['methods'].items()}
    out += ['', 'Probe prompt lengths per method (per repeat when they differ): '
            + '; '.join(f'{n}: {v}' for n, v in inputs.items() if v and v != [[]])]
    return '\n'.join(out) + '\n'


def _fitted(grid, design, arch, hardware, k, seed):
    """Return {name: model} of the plotted methods fitted on repeat 0."""
    chosen = [m for m in methods(arch, hardware) if m.name in PLOTTED]
    return {m.name: m.predictor.fit(choose_probes(m, grid, design, grid.repeats[0], k,
                                                  seed)[0]) for m in chosen}


def plot(report, grid, design, arch, hardware, path, k=5, seed=0):
    """Write the measured-vs-predicted figure (PNG) to ``path``."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    models = _fitted(grid, design, arch, hardware, k, seed)
    target = Target.of(grid, design, grid.repeats)
    n_in = np.array(design.n_in_values)
    fig, axes = plt.subplots(2, 3, figsize=(16, 9.5))
    for ax, n_out in zip(axes[0, :2], (design.id_n_out[-1], design.n_out_max)):
        ax.plot(n_in, [target.e2e[(n, n_out)] for n in n_in], 'ko', label='measured (mean)')
        for name, model in models.items():
            ax.plot(n_in, [model.e2e_s(int(n), n_out) for n in n_in], label=name)
        ax.axvline(design.id_n_in[-1], color='grey', ls=':')
        ax.set(title=f'L(n_in, n_out={n_out})', xlabel='n_in, tokens', ylabel='seconds')
    ax = axes[0, 2]
    n_out = np.array(design.n_out_values)
    for n, style in ((design.id_n_in[len(design.id_n_in) // 2], 'o'), (int(n_in[-1]), 's')):
        ax.plot(n_out, [target.e2e[(n, o)] for o in n_out], 'k' + style,
                label=f'measured, n_in={n}')
        for i, (name, model) in enumerate(models.items()):
            ax.plot(n_out, [model.e2e_s(n, int(o)) for o in n_out], color=f'C{i}')
    ax.axvline(design.id_n_out[-1], color='grey', ls=':')
    ax.set(title='L(n_in, n_out) over n_out', xlabel='n_out, tokens', ylabel='seconds')
    ax.legend(fontsize=7)
    ax = axes[1, 0]
    ax.plot(n_in, [target.ttft[n] for n in n_in], 'ko')
    for name, model in models.items():
        ax.plot(n_in, model.prefill_s(n_in), label=name)
    ax.set(title='t_prefill (TTFT)', xlabel='n_in, tokens', ylabel='seconds')
    ax = axes[1, 1]
    ax.plot(n_in, [target.mean_step[n] * 1e3 for n in n_in], 'ko')
    for name, model in models.items():
        ax.plot(n_in, [np.mean(model.step_s(np.arange(n, n + grid.n_out_max - 1))) * 1e3
                       for n in n_in], label=name)
    ax.set(title=f'mean decoding step over n_kv = n_in .. n_in+{grid.n_out_max - 2}',
           xlabel='n_in, tokens', ylabel='ms')
    ax = axes[1, 2]
    for i, (name, entry) in enumerate(report['methods'].items()):
        ax.loglog(max(entry['cost_s'], 0.1), entry['scores']['all']['mape'], 'o',
                  color=f'C{i % 10}')
        ax.annotate(name.split(' (`')[0], (max(entry['cost_s'], 0.1),
                                           entry['scores']['all']['mape']), fontsize=7)
    for name, entry in report['calibrations'].items():
        ax.loglog(entry['profiling_s'], entry['scores']['all']['mape'], 'kx')
        ax.annotate(name, (entry['profiling_s'], entry['scores']['all']['mape']), fontsize=7)
    ax.set(title='all-cells MAPE vs profiling cost (x: saved calibrations)', xlabel='profiling, s',
           ylabel='MAPE of L, %')
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"{report['meta'].get('model_key')} on {report['meta'].get('device')}: "
                 'measured (black) vs predicted (fitted on repeat 0); dotted = end of the '
                 'fitted range')
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write(report, design, out_dir):
    """Write report.md and report.json to ``out_dir``; return the markdown."""
    text = markdown(report, design)
    with open(os.path.join(out_dir, 'report.md'), 'w', encoding='utf-8') as stream:
        stream.write(text)
    with open(os.path.join(out_dir, 'report.json'), 'w', encoding='utf-8') as stream:
        json.dump(report, stream, indent=1, default=list)
        stream.write('\n')
    return text
