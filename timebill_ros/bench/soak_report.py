"""``timebill soak``'s figures: per-minute rows, the summary, soak.md and soak.png.

A run is kept in three files, small enough to commit beside its table: soak_goals.csv (one
row per goal sent), soak_samples.csv (the node process's samples) and soak_run.json (the rest:
command, host, events, node exit). :func:`read_run` rebuilds the run from them, so
``timebill soak --report-only`` recomputes every figure of soak.md from what is committed.

Everything here works on plain values, so the tests feed it synthetic runs. A run is a dict:
``records`` (one dict per goal sent, times in seconds from the load's start: ``sent_s``,
``response_s`` and ``accepted`` once the goal response came, ``ended_s``, ``status``,
``status_name``, ``error_code``, ``goal_status``, ``deadline_met``, ``total_s``, ``queue_s``,
``predicted_wcet_s`` once the result came), ``samples`` ({t_s, rss_mb, threads, fds} of the
node process), ``duration_s`` (the load), ``end_s`` (when the soak stopped waiting),
``grace_s``, ``node_died_s`` (None while it lived), and what :func:`render_markdown` prints.
"""

import csv
import datetime
import json
import math
import os
import platform

import numpy as np

from timebill_ros.server.status import (CANCELED, COMPLETED, ERROR_INACTIVE, KILLED, REJECTED,
                                        SKIPPED, STATUS_NAMES)

# The columns of soak_goals.csv (a record's keys; a missing one is written empty).
GOAL_COLUMNS = ('index', 'kind', 'policy', 'budget_s', 'cancel_after_s', 'at_s', 'sent_s',
                'response_s', 'accepted', 'ended_s', 'status_name', 'error_code', 'goal_status',
                'deadline_met', 'total_s', 'queue_s', 'predicted_wcet_s', 'truncated',
                'executor', 'cached_tokens')
SAMPLE_COLUMNS = ('t_s', 'rss_mb', 'threads', 'fds')
RUN_FILE = 'soak_run.json'  # the run without its records and samples (those are the CSVs)
GOALS_FILE = 'soak_goals.csv'
SAMPLES_FILE = 'soak_samples.csv'
INT_COLUMNS = ('index', 'policy', 'error_code', 'goal_status', 'cached_tokens', 'threads',
               'fds')
BOOL_COLUMNS = ('accepted', 'deadline_met', 'truncated')
TEXT_COLUMNS = ('kind', 'status_name', 'executor')  # every other column is a float (s or MB)
# The action_msgs GoalStatus code each terminal status may reach the client with: SUCCEEDED
# (4), CANCELED (5); every other status ABORTED (6).
GOAL_STATUS_OF = {COMPLETED: 4, CANCELED: 5}
GOAL_STATUS_ABORTED = 6
WINDOW_S = 600.0  # first / last window of a run of at least LONG_RUN_S, s
LONG_RUN_S = 1800.0  # shorter runs compare thirds and fit from the first third's end
RAN = (COMPLETED, KILLED, SKIPPED)  # the goals the miss rate counts (SKIPPED: came due, late)


def percentile(values, q):
    """Return the ``q`` quantile (0..1) of ``values``, linearly interpolated; None if empty."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f'q must be in [0, 1], got {q!r}')
    data = list(values)
    return float(np.quantile(data, q)) if data else None


def loss_state(record, end_s, grace_s):
    """Return what became of a goal by ``end_s`` (s): ended, lost, pending, unanswered, refused.

    lost: accepted, and no result by sent + budget (0 if negative) + ``grace_s`` (a result
    after that is lost too); unanswered: no goal response by then; pending: still within
    that time at ``end_s``; refused: the goal response said not accepted.
    """
    if record.get('accepted') is False:
        return 'refused'
    limit = record['sent_s'] + max(record['budget_s'], 0.0) + grace_s
    if record.get('ended_s') is not None:
        return 'ended' if record['ended_s'] <= limit else 'lost'
    if end_s <= limit:
        return 'pending'
    return 'unanswered' if record.get('accepted') is None else 'lost'


def missed(record):
    """Return whether a goal that ran missed its deadline (KILLED, SKIPPED or completed late)."""
    return record['status'] in (KILLED, SKIPPED) or not record.get('deadline_met', False)


def wcet_covered(record, with_queue=False):
    """Return whether a completed goal's run (total - queue, s) stayed within predicted_wcet.

    None when the result has no predicted_wcet (0). predicted_wcet bounds the run, the
    queue excluded (action/Instruct.action), so the queue time is taken off the total;
    ``with_queue`` compares the whole total (receipt to result, the queue wait included).
    """
    wcet = record.get('predicted_wcet_s') or 0.0
    if wcet <= 0:
        return None
    queue_s = 0.0 if with_queue else record.get('queue_s', 0.0)
    return record['total_s'] - queue_s <= wcet


def status_column(record):
    """Return the column of a goal's terminal status: its name, or 'other' (e.g. status 0)."""
    return STATUS_NAMES.get(record['status'], 'other')


def _in(t_s, start_s, stop_s):
    return t_s is not None and start_s <= t_s < stop_s


def _ms(values, q):
    value = percentile(values, q)
    return None if value is None else value * 1e3


def _ratio(part, whole):
    return part / whole if whole else None


def window_stats(records, start_s, stop_s, end_s, grace_s):
    """Return the figures of the goals sent / ended in [start_s, stop_s) (s): one table row.

    Sent, lost and latencies count goals by their send time; terminal states, the miss
    rate and the WCET coverage by the time their result came.
    """
    sent = [r for r in records if _in(r['sent_s'], start_s, stop_s)]
    ended = [r for r in records if _in(r.get('ended_s'), start_s, stop_s)]
    states = [loss_state(r, end_s, grace_s) for r in sent]
    response = [r['response_s'] - r['sent_s'] for r in sent if r.get('response_s') is not None]
    refusal = [r['ended_s'] - r['sent_s'] for r in sent
               if r.get('ended_s') is not None and r['status'] == REJECTED]
    ran = [r for r in ended if r['status'] in RAN]
    completed = [r for r in ended if r['status'] == COMPLETED]
    covered = [c for c in (wcet_covered(r) for r in completed) if c is not None]
    covered_queue = [c for c in (wcet_covered(r, True) for r in completed) if c is not None]
    row = {'sent': len(sent), 'lost': states.count('lost') + states.count('unanswered'),
           'pending': states.count('pending'),
           'inactive': sum(r['status'] == REJECTED and r.get('error_code') == ERROR_INACTIVE
                           for r in ended),
           'response_p50_ms': _ms(response, 0.5), 'response_p99_ms': _ms(response, 0.99),
           'refusal_p50_ms': _ms(refusal, 0.5), 'refusal_p99_ms': _ms(refusal, 0.99),
           'miss_rate': _ratio(sum(missed(r) for r in ran), len(ran)), 'ran': len(ran),
           'wcet_coverage': _ratio(sum(covered), len(covered)),
           'wcet_coverage_with_queue': _ratio(sum(covered_queue), len(covered_queue))}
    for name in list(STATUS_NAMES.values()) + ['other']:
        row[name] = sum(status_column(r) == name for r in ended)
    return row


def last_sample(samples, start_s, stop_s):
    """Return the last sample taken in [start_s, stop_s), or None."""
    inside = [s for s in samples if _in(s['t_s'], start_s, stop_s)]
    return inside[-1] if inside else None


def minute_rows(run):
    """Return one row per minute from the load's start to ``end_s`` (resources: last sample)."""
    end_s, grace_s = _loss_end(run), run['grace_s']
    n_minutes = max(1, math.ceil(run['end_s'] / 60.0))
    rows = []
    for minute in range(n_minutes):
        start, stop = minute * 60.0, (minute + 1) * 60.0
        row = {'minute': minute, 'after_load': start >= run['duration_s']}
        row.update(window_stats(run['records'], start, stop, end_s, grace_s))
        sample = last_sample(run['samples'], start, stop)
        for key in ('rss_mb', 'threads', 'fds'):
            row[key] = None if sample is None else sample[key]
        rows.append(row)
    return rows


def _loss_end(run):
    """Return the time up to which goals had their chance: end_s, or forever if the node died."""
    return math.inf if run.get('node_died_s') is not None else run['end_s']


def compare_windows(duration_s):
    """Return ((first start, stop), (last start, stop), fit start) in s for a run's length.

    Runs of LONG_RUN_S or more: the first and last WINDOW_S, RSS fitted after the first
    WINDOW_S; shorter runs: the first and last third, fitted after the first third.
    """
    if duration_s <= 0:
        raise ValueError(f'duration_s must be > 0, got {duration_s!r}')
    span = WINDOW_S if duration_s >= LONG_RUN_S else duration_s / 3.0
    return (0.0, span), (duration_s - span, duration_s), span


def growth_mb_per_h(samples, start_s, stop_s):
    """Return the least-squares slope of RSS (MB) over time (h) in [start_s, stop_s].

    None with fewer than two samples there (or all at one time).
    """
    points = [(s['t_s'] / 3600.0, s['rss_mb']) for s in samples if start_s <= s['t_s'] <= stop_s]
    if len(points) < 2:
        return None
    hours, rss_mb = np.array(points).T
    if np.ptp(hours) == 0:
        return None
    return float(np.polyfit(hours, rss_mb, 1)[0])


SWAP_SETTLE_S = 120.0  # after a predictor swap, seconds left out of the "after" fit


def swap_growth(run, samples, fit_from, duration_s):
    """Return the RSS fit on each side of the run's predictor swap, or None without one.

    A swap adds the new predictors' memory once (a level step), which a fit over the whole
    run reads as growth. ``{swap_s, before, after, mean_before, mean_after}``: the slopes
    (MB/hour) over [fit_from, swap) and [swap + SWAP_SETTLE_S, end], the mean RSS (MB) of each.
    """
    swaps = [e['t_s'] for e in run.get('events', [])
             if e['event'] == 'predictor swap' and e.get('copied')]
    if not swaps or not fit_from < swaps[0] < duration_s - SWAP_SETTLE_S:
        return None
    swap_s = swaps[0]
    sides = ((fit_from, swap_s - 1e-9), (swap_s + SWAP_SETTLE_S, duration_s))

    def mean(start_s, stop_s):
        values = [x['rss_mb'] for x in samples if start_s <= x['t_s'] <= stop_s]
        return float(np.mean(values)) if values else None
    return {'swap_s': swap_s, 'windows_s': sides,
            'before': growth_mb_per_h(samples, *sides[0]),
            'after': growth_mb_per_h(samples, *sides[1]),
            'mean_before': mean(*sides[0]), 'mean_after': mean(*sides[1])}


def _first_last(samples, key):
    return (samples[0][key], samples[-1][key]) if samples else (None, None)


def summarize(run):
    """Return the run's summary: totals, losses, resources, latency windows, and ok/failures."""
    records, samples, duration_s = run['records'], run['samples'], run['duration_s']
    end_s, grace_s = _loss_end(run), run['grace_s']
    states = [loss_state(r, end_s, grace_s) for r in records]
    first, last, fit_from = compare_windows(duration_s)
    load = window_stats(records, 0.0, math.inf, end_s, grace_s)
    early = window_stats(records, *first, end_s, grace_s)
    late = window_stats(records, *last, end_s, grace_s)
    ended = [r for r in records if r.get('ended_s') is not None]
    summary = {
        'sent': len(records), 'by_status': {name: load[name] for name in
                                            list(STATUS_NAMES.values()) + ['other']},
        'inactive_rejected': load['inactive'],
        'lost': states.count('lost'), 'unanswered': states.count('unanswered'),
        'pending': states.count('pending'), 'refused': states.count('refused'),
        'late_results': sum(s == 'lost' and r.get('ended_s') is not None
                            for s, r in zip(states, records)),
        'inconsistent': sum(r.get('goal_status') != GOAL_STATUS_OF.get(
            r['status'], GOAL_STATUS_ABORTED) for r in ended),
        'rss_mb': _first_last(samples, 'rss_mb'),
        'rss_max_mb': max((s['rss_mb'] for s in samples), default=None),
        'threads': _first_last(samples, 'threads'), 'fds': _first_last(samples, 'fds'),
        'growth_mb_per_h': growth_mb_per_h(samples, fit_from, duration_s),
        'swap_growth': swap_growth(run, samples, fit_from, duration_s),
        'fit_window_s': (fit_from, duration_s), 'first_window_s': first, 'last_window_s': last,
        'response_p99_ms': (early['response_p99_ms'], late['response_p99_ms']),
        'refusal_p99_ms': (early['refusal_p99_ms'], late['refusal_p99_ms']),
        'miss_rate': load['miss_rate'], 'ran': load['ran'],
        'wcet_coverage': load['wcet_coverage'],
        'wcet_coverage_with_queue': load['wcet_coverage_with_queue']}
    summary['failures'] = failures(run, summary)
    summary['ok'] = not summary['failures']
    return summary


def failures(run, summary):
    """Return why the soak failed (texts; empty when it passed)."""
    found = []
    if not run.get('ready', True):
        found.append('the node did not come up')
    if run.get('node_died_s') is not None:
        found.append(f'the node died at {run["node_died_s"]:.0f} s')
    for key, text in (('lost', 'lost goals (accepted, no result within budget + grace)'),
                      ('unanswered', 'goals with no goal response within budget + grace'),
                      ('refused', 'goals refused at the goal response'),):
        if summary[key]:
            found.append(f'{summary[key]} {text}')
    if summary['by_status']['other']:
        found.append(f'{summary["by_status"]["other"]} results without a terminal status')
    code = run.get('node_exit_code')
    if code not in (None, 0) or run.get('node_killed'):
        found.append(f'the node did not stop cleanly (exit code {code}'
                     f'{", killed after SIGINT timed out" if run.get("node_killed") else ""})')
    return found


# --- output ---------------------------------------------------------------------------------
def _fmt(value, digits=0, unit=''):
    if value is None:
        return '-'
    if isinstance(value, float) and math.isinf(value):
        return 'inf'
    return f'{value:.{digits}f}{unit}'


def _pair(values, digits=0, unit=''):
    return f'{_fmt(values[0], digits, unit)} -> {_fmt(values[1], digits, unit)}'


TABLE_HEAD = ('| min | sent | COMPLETED | KILLED | SKIPPED | REJECTED (INACTIVE) | CANCELED | '
              'FAILED | other | lost | pending | RSS MB | threads | fds | response p50 / p99 ms'
              ' | refusal p50 / p99 ms | miss rate | WCET coverage | WCET coverage, queue'
              ' included |')


def table_lines(rows):
    """Return the per-minute Markdown table (minutes after the load marked ``+``)."""
    lines = [TABLE_HEAD, '|' + '---|' * TABLE_HEAD.count(' | ') + '---|']
    for row in rows:
        lines.append(
            f"| {row['minute']}{'+' if row['after_load'] else ''} | {row['sent']} | "
            f"{row['COMPLETED']} | {row['KILLED']} | {row['SKIPPED']} | "
            f"{row['REJECTED']} ({row['inactive']}) | {row['CANCELED']} | {row['FAILED']} | "
            f"{row['other']} | {row['lost']} | {row['pending']} | {_fmt(row['rss_mb'])} | "
            f"{_fmt(row['threads'])} | {_fmt(row['fds'])} | "
            f"{_fmt(row['response_p50_ms'], 1)} / {_fmt(row['response_p99_ms'], 1)} | "
            f"{_fmt(row['refusal_p50_ms'], 1)} / {_fmt(row['refusal_p99_ms'], 1)} | "
            f"{_fmt(row['miss_rate'], 2)} | {_fmt(row['wcet_coverage'], 2)} | "
            f"{_fmt(row['wcet_coverage_with_queue'], 2)} |")
    return lines


def summary_lines(run, summary):
    """Return the summary as Markdown bullet lines."""
    first, last, fit = (summary['first_window_s'], summary['last_window_s'],
                        summary['fit_window_s'])
    by_status = ', '.join(f'{name} {n}' for name, n in summary['by_status'].items() if n)
    lines = [
        f"- **{'PASS' if summary['ok'] else 'FAIL'}**"
        + ('' if summary['ok'] else ': ' + '; '.join(summary['failures'])),
        f"- goals: {summary['sent']} sent; {by_status or 'none ended'}; REJECTED as INACTIVE "
        f"(sent while deactivated): {summary['inactive_rejected']}",
        f"- lost goals: {summary['lost']} (of which late results {summary['late_results']}); "
        f"no goal response: {summary['unanswered']}; pending at the end (within their "
        f"grace): {summary['pending']}; inconsistent (GoalStatus, status) pairs: "
        f"{summary['inconsistent']}",
        f"- node RSS: {_pair(summary['rss_mb'])} MB (max {_fmt(summary['rss_max_mb'])}); "
        f"growth fitted (least squares) over {fit[0] / 60:.1f}-{fit[1] / 60:.1f} min: "
        f"{_fmt(summary['growth_mb_per_h'], 1)} MB/hour",
        *_swap_lines(summary.get('swap_growth')),
        f"- threads: {_pair(summary['threads'])}; open fds: {_pair(summary['fds'])} "
        f"(first sample -> last)",
        f"- goal response p99: {_pair(summary['response_p99_ms'], 1)} ms (sent in "
        f"{first[0] / 60:.1f}-{first[1] / 60:.1f} min -> {last[0] / 60:.1f}-"
        f"{last[1] / 60:.1f} min); refusal p99: {_pair(summary['refusal_p99_ms'], 1)} ms",
        f"- deadline miss rate of the {summary['ran']} goals that ran: "
        f"{_fmt(summary['miss_rate'], 3)}; WCET coverage of completed goals: "
        f"{_fmt(summary['wcet_coverage'], 3)} (run = total - queue, what predicted_wcet "
        f"bounds); {_fmt(summary['wcet_coverage_with_queue'], 3)} with the queue wait "
        f"included (total)"]
    lines += [f"- {event_text(event)}" for event in run.get('events', [])]
    lines += [f'- node log: `{line}`' for line in run.get('swap_log', [])]
    if run.get('node_pid') is not None:
        lines.append(f"- node process sampled: pid {run['node_pid']} "
                     f"(`{run.get('node_cmdline', '')}`)")
    lines.append(f"- node stop: exit code {run.get('node_exit_code')} after "
                 f"{_fmt(run.get('node_stop_s'), 1)} s"
                 f"{' (SIGKILL)' if run.get('node_killed') else ''}")
    return lines


def _swap_lines(split):
    """Return the line of the RSS fits on each side of a predictor swap (none without one)."""
    if split is None:
        return []
    (b0, b1), (a0, a1) = split['windows_s']
    return [f"- around the predictor swap at {split['swap_s'] / 60:.1f} min (a level step, not "
            f"growth): {_fmt(split['before'], 1)} MB/hour over {b0 / 60:.1f}-{b1 / 60:.1f} min, "
            f"{_fmt(split['after'], 1)} MB/hour over {a0 / 60:.1f}-{a1 / 60:.1f} min; mean RSS "
            f"{_fmt(split['mean_before'])} -> {_fmt(split['mean_after'])} MB"]


def event_text(event):
    """Return one line about a lifecycle, predictor swap or node event."""
    at = f"{event['t_s']:.0f} s"
    if event['event'] in ('activate', 'deactivate'):
        return (f"{event['event']} at {at}: {'done' if event['ok'] else 'FAILED'} in "
                f"{event['took_s']:.2f} s")
    if event['event'] == 'predictor swap':
        copied = ', '.join(event['copied'])
        return f"predictor swap at {at}: {event['why']}" + (f' ({copied})' if copied else '')
    return f"{event['event']} at {at}" + (f" (code {event['code']})" if 'code' in event else '')


def render_markdown(run, rows, summary, out=None):
    """Return soak.md's text: command, host, date, duration, the summary and the table.

    out: the folder the run is kept in; the text then names the command that recomputes it.
    """
    again = [] if out is None else [
        f'Recompute: `timebill soak --report-only --out {out}` (reads only {RUN_FILE}, '
        f'{GOALS_FILE} and {SAMPLES_FILE} beside this file)', '']
    return '\n'.join([
        '# Soak: the node under mixed load, per minute', '',
        f"Command: `{run.get('command', 'timebill soak')}` (seed {run.get('seed')}, "
        f"{_fmt(run.get('rate'), 2)} goals/s plus bursts)", ''] + again + [
        f"Host: {run.get('host', platform.node())}, {run.get('cpus', os.cpu_count())} CPUs; "
        f"date {run.get('date', '-')}; load {run['duration_s'] / 60:.1f} min, then "
        f"{max(run['end_s'] - run['duration_s'], 0.0):.0f} s waiting for the last results. Node "
        f"parameters: `{run.get('node_params', '-')}`.", '',
        '## Summary', ''] + summary_lines(run, summary) + [
        '', '## Per minute', '',
        'Sent, lost and latencies count goals by the minute they were sent; terminal states, '
        'miss rate and WCET coverage by the minute their result came. Lost: accepted and no '
        f"result within budget + {run['grace_s']:.0f} s. Response: send -> goal response; "
        'refusal: send -> REJECTED result. Miss rate: KILLED, SKIPPED and late COMPLETED '
        'over the goals that ran (those three). WCET coverage: completed goals whose run '
        '(total - queue) stayed within predicted_wcet; queue included: whose whole total '
        '(receipt to result) did. RSS, threads, fds: the `timebill serve` '
        "process's last sample of the minute. `+`: after the load.", ''] + table_lines(rows)) \
        + '\n'


def plot(rows, path):
    """Write soak.png: goals by state, RSS, threads / fds and latencies per minute."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    minutes = [row['minute'] for row in rows]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    goals, rss, counts, latency = axes.ravel()
    for name in ['sent'] + list(STATUS_NAMES.values()) + ['lost']:
        goals.plot(minutes, [row[name] for row in rows], marker='.', label=name)
    _line(rss, minutes, rows, 'rss_mb', 'RSS')
    _line(counts, minutes, rows, 'threads', 'threads')
    _line(counts, minutes, rows, 'fds', 'open fds')
    for key, label in (('response_p50_ms', 'response p50'), ('response_p99_ms', 'response p99'),
                       ('refusal_p50_ms', 'refusal p50'), ('refusal_p99_ms', 'refusal p99')):
        _line(latency, minutes, rows, key, label)
    goals.set(title='goals per minute', ylabel='goals')
    rss.set(title='node RSS', ylabel='MB')
    counts.set(title='node threads and open fds', ylabel='count')
    latency.set(title='goal response and refusal latency', ylabel='ms')
    for axis in axes.ravel():
        axis.set_xlabel('minute')
        axis.set_ylim(bottom=0)
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _line(axis, minutes, rows, key, label):
    points = [(m, row[key]) for m, row in zip(minutes, rows) if row[key] is not None]
    axis.plot([m for m, _ in points], [v for _, v in points], marker='.', label=label)


def write_outputs(run, out, keep_run=True, named=None):
    """Write soak.md and soak.png into ``out`` and print soak.md; return the summary.

    With ``keep_run``, also keep the run there: the CSV rows and soak_run.json (its other
    fields; figures are recomputed from these, never stored). named: the folder soak.md's
    recompute command names (default ``out``; another when rebuilt elsewhere to compare).
    """
    run.setdefault('host', platform.node())
    run.setdefault('cpus', os.cpu_count())
    run.setdefault('date', datetime.datetime.now().isoformat(timespec='seconds'))
    rows = minute_rows(run)
    summary = summarize(run)
    text = render_markdown(run, rows, summary, out if named is None else named)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, 'soak.md'), 'w', encoding='utf-8') as stream:
        stream.write(text)
    if keep_run:
        meta = {key: value for key, value in run.items() if key not in ('records', 'samples')}
        with open(os.path.join(out, RUN_FILE), 'w', encoding='utf-8') as stream:
            json.dump({'run': meta}, stream, indent=1, default=str)
            stream.write('\n')
        write_csv(os.path.join(out, GOALS_FILE), GOAL_COLUMNS, run.get('records', ()))
        write_csv(os.path.join(out, SAMPLES_FILE), SAMPLE_COLUMNS, run.get('samples', ()))
    plot(rows, os.path.join(out, 'soak.png'))
    print(text, flush=True)
    return summary


def write_csv(path, columns, dicts):
    """Write ``dicts`` as CSV rows of ``columns`` (floats to 6 decimals; None empty)."""
    def cell(value):
        if value is None:
            return ''
        return f'{value:.6f}' if isinstance(value, float) else value

    with open(path, 'w', encoding='utf-8', newline='') as stream:
        writer = csv.writer(stream)
        writer.writerow(columns)
        for item in dicts:
            writer.writerow([cell(item.get(column)) for column in columns])


def read_run(out):
    """Return the run kept in ``out`` (soak_run.json and the two CSVs), as :func:`summarize` takes.

    A goal's ``status`` comes back from its ``status_name`` (a name of STATUS_NAMES, or the
    code itself when unknown; empty: no result). Raises FileNotFoundError naming a missing file
    and ValueError naming a cell that does not parse.
    """
    paths = [os.path.join(out, name) for name in (RUN_FILE, GOALS_FILE, SAMPLES_FILE)]
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f'no {path}: run the soak first (its run is kept there)')
    with open(paths[0], encoding='utf-8') as stream:
        run = dict(json.load(stream)['run'])
    run['records'] = [_with_status(row) for row in read_csv(paths[1])]
    run['samples'] = read_csv(paths[2])
    return run


def read_csv(path):
    """Return the rows of a CSV written by :func:`write_csv`, each cell typed by its column."""
    with open(path, encoding='utf-8', newline='') as stream:
        reader = csv.DictReader(stream)
        return [{column: _cell(path, line, column, text) for column, text in row.items()}
                for line, row in enumerate(reader, start=2)]


def _cell(path, line, column, text):
    if text == '':
        return None
    try:
        if column in TEXT_COLUMNS:
            return text
        if column in BOOL_COLUMNS:
            return {'True': True, 'False': False}[text]
        return int(text) if column in INT_COLUMNS else float(text)
    except (KeyError, ValueError):
        raise ValueError(f'{path}:{line}: column {column!r} holds {text!r}') from None


STATUS_OF_NAME = {name: code for code, name in STATUS_NAMES.items()}


def _with_status(record):
    name = record.get('status_name')
    if name is None:
        record['status'] = None
    elif name in STATUS_OF_NAME:
        record['status'] = STATUS_OF_NAME[name]
    elif name.lstrip('-').isdigit():
        record['status'] = int(name)
    else:
        raise ValueError(f'status_name {name!r} is neither a status name nor a code')
    return record
