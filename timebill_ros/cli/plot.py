"""``timebill plot``: PNGs of a ``timebill record`` file (goal events and stats).

- ``wcet.png``: each goal's run time (total minus queue time) against its t^_WCET, the
  diagonal marking the bound; goals over it broke the WCET promise.
- ``timeline.png``: goals by end time (met / missed their deadline), the running miss count,
  and the queue depth from ``~/stats``.
- ``counts.png``: alpha* of the goals that ran, and the goals by error code.
"""

import collections
import json
import pathlib


def load_recording(path):
    """Return (events, stats): the message dicts of a record file, in file order."""
    events, stats = [], []
    for line_no, line in enumerate(pathlib.Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f'{path}:{line_no}: not JSON ({exc})') from exc
        (events if row.get('topic') == 'events' else stats).append(row)
    return events, stats


def _ran(event):
    """Return True for a goal that ran (it has a t^_WCET and was not refused)."""
    from timebill_ros.server import status
    return event['predicted_wcet_s'] > 0 and event['status'] != status.REJECTED


def plot_wcet(events, path):
    """Scatter each goal's run time (s) against its t^_WCET (s); return the goals drawn."""
    import matplotlib.pyplot as plt
    ran = [e for e in events if _ran(e)]
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    run_s = [e['total_time_s'] - e['queue_time_s'] for e in ran]
    wcet_s = [e['predicted_wcet_s'] for e in ran]
    over = [r > w for r, w in zip(run_s, wcet_s)]
    for is_over, style in ((False, dict(s=14, color='tab:blue', label='within t^_WCET')),
                           (True, dict(s=18, color='tab:red', marker='x',
                                       label='over t^_WCET'))):
        pairs = [(w, r) for w, r, o in zip(wcet_s, run_s, over) if o == is_over]
        ax.scatter([w for w, _ in pairs], [r for _, r in pairs], **style)
    top = max(wcet_s + run_s + [1e-3]) * 1.05
    ax.plot([0, top], [0, top], color='grey', linewidth=0.8)
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel('t^_WCET (s)')
    ax.set_ylabel('run time: total - queue (s)')
    ax.set_title(f'{len(ran)} goals that ran, {sum(over)} over their t^_WCET')
    ax.legend(loc='upper left', fontsize=8)
    _save(fig, path)
    return len(ran)


def _due(event):
    """Return True for a goal that counts for deadlines (not bad input, not canceled).

    The same rule as ~/stats: infeasible refusals count as misses.
    """
    from timebill_ros.server import status
    if event['status'] == status.CANCELED:
        return False
    return event['status'] != status.REJECTED or event['infeasible']


def plot_timeline(events, stats, path):
    """Plot due goals met / missed over time, the running miss count and the queue depth."""
    import matplotlib.pyplot as plt
    start = min([e['stamp'] for e in events] + [s['stamp'] for s in stats] or [0.0])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 4.5), sharex=True)
    due = [e for e in events if _due(e)]
    times = [e['stamp'] - start for e in due]
    met = [e['deadline_met'] for e in due]
    top.scatter([t for t, m in zip(times, met) if m], [1] * sum(met), s=14,
                color='tab:green', label='met its deadline')
    top.scatter([t for t, m in zip(times, met) if not m], [0] * (len(met) - sum(met)), s=18,
                color='tab:red', marker='x', label='missed (incl. refused as infeasible)')
    misses, running = [], 0
    for m in met:
        running += not m
        misses.append(running)
    twin = top.twinx()
    twin.step(times, misses, where='post', color='tab:red', linewidth=0.8)
    twin.set_ylabel('misses so far')
    top.set_yticks([0, 1], ['missed', 'met'])
    top.set_ylim(-0.6, 2.2)
    top.legend(loc='upper left', fontsize=7, ncol=2)
    top.set_title(f'{len(due)} due goals, {running} missed their deadline '
                  f'({len(events) - len(due)} bad input or canceled not shown)')
    bottom.step([s['stamp'] - start for s in stats], [s['queue_depth'] for s in stats],
                where='post', color='tab:blue')
    bottom.set_ylabel('queue depth')
    bottom.set_xlabel('time since the first message (s)')
    _save(fig, path)


def plot_counts(events, path):
    """Plot the histogram of alpha* (goals that ran) and the goals by error code."""
    import matplotlib.pyplot as plt

    from timebill_ros.server.status import ERROR_NAMES
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.5))
    alphas = [e['eviction_ratio'] for e in events if _ran(e)]
    left.hist(alphas, bins=[i / 10 for i in range(11)], color='tab:blue')
    left.set_xlabel('alpha* (share of the prompt KV evicted)')
    left.set_ylabel('goals')
    codes = collections.Counter(e.get('error_code', 0) for e in events)
    names = [ERROR_NAMES.get(code, str(code)) for code in sorted(codes)]
    right.barh(names, [codes[code] for code in sorted(codes)], color='tab:orange')
    right.set_xlabel('goals')
    right.set_title('error codes')
    _save(fig, path)


def _save(fig, path):
    """Write a figure as a PNG and free it."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_recording(record_path, out_dir):
    """Write wcet.png, timeline.png and counts.png of a record file; return their paths."""
    import matplotlib
    matplotlib.use('Agg')
    events, stats = load_recording(record_path)
    if not events:
        raise ValueError(f'{record_path}: no goal events recorded')
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / name for name in ('wcet.png', 'timeline.png', 'counts.png')]
    plot_wcet(events, paths[0])
    plot_timeline(events, stats, paths[1])
    plot_counts(events, paths[2])
    return paths


def cmd_plot(args, ros_args):
    """Draw a timebill record file as PNGs (t^_WCET per goal, misses, queue, alpha*, codes)."""
    for path in plot_recording(args.recording, args.out):
        print(path)
    return 0


def add_parser(sub):
    """Add the ``plot`` command to ``sub``."""
    plot = sub.add_parser('plot', help=cmd_plot.__doc__)
    plot.add_argument('recording', help='a file written by timebill record')
    plot.add_argument('--out', default='timebill_plots', help='folder of the PNGs')
    plot.set_defaults(func=cmd_plot)
