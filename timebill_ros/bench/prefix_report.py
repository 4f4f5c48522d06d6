"""The tables and plot of ``timebill prefixbench`` (prefix.md, prefix.png) from prefix.json."""

import os
import statistics


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else float('nan')


def _follow_ups(goals):
    lines = ['| context | placement | cached tokens | prefill reuse / none (s) | ratio | '
             'total reuse / none (s) |', '|---|---|---|---|---|---|']
    keys = sorted({(g['context_tokens'], g['placement']) for g in goals})
    for n_tokens, placement in keys:
        def pick(reuse, field):
            return _mean([g[field] for g in goals if g['kind'] == 'follow-up'
                          and g['reuse'] is reuse and g['context_tokens'] == n_tokens
                          and g['placement'] == placement])
        on, off = pick(True, 'prefill_s'), pick(False, 'prefill_s')
        lines.append(f"| ~{n_tokens} | {placement} | {pick(True, 'cached_tokens'):.0f} / "
                     f"{pick(True, 'prompt_tokens'):.0f} | {on:.2f} / {off:.2f} | "
                     f"{on / off:.3f} | {pick(True, 'total_s'):.2f} / "
                     f"{pick(False, 'total_s'):.2f} |")
    return lines


def _budgets(budgets, kill):
    lines = ['| context | placement | question | smallest on-time budget reuse / none (s) | '
             'at the Kill budget reuse / none |', '|---|---|---|---|---|']
    keys = sorted({(b['context_tokens'], b['placement'], b['question']) for b in budgets})
    for n_tokens, placement, question in keys:
        found = {b['reuse']: b['smallest_budget_s'] for b in budgets
                 if (b['context_tokens'], b['placement'], b['question'])
                 == (n_tokens, placement, question)}
        outcome = {g['reuse']: g['status'] + (' on time' if g['deadline_met'] else '')
                   for g in kill if (g['context_tokens'], g['placement'], g['question'])
                   == (n_tokens, placement, question)}

        def fmt(value):
            return 'none of the ladder' if value is None else f'{value:.2f}'
        lines.append(f"| ~{n_tokens} | {placement} | {question[:38]} | "
                     f"{fmt(found.get(True))} / {fmt(found.get(False))} | "
                     f"{outcome.get(True, '-')} / {outcome.get(False, '-')} |")
    return lines


def _model(goals):
    lines = ['| goals | n | prefill MAPE of the time model | t^_WCET coverage (ran to the end) |',
             '|---|---|---|---|']
    ran = [g for g in goals if g['prefill_s'] > 0]
    for label, group in (('hits', [g for g in ran if g['cached_tokens'] > 0]),
                         ('misses', [g for g in ran if g['cached_tokens'] == 0])):
        if not group:
            continue
        mape = 100 * _mean([abs(g['predicted_prefill_s'] - g['prefill_s']) / g['prefill_s']
                            for g in group])
        ended = [g for g in group if g['status'] == 'COMPLETED' and g['wcet_s'] > 0]
        covered = sum(g['execution_s'] <= g['wcet_s'] for g in ended)
        lines.append(f'| {label} | {len(group)} | {mape:.1f} % | {covered}/{len(ended)} |')
    return lines


def _identity(identity):
    same = sum(i['identical'] for i in identity if i['hit'])
    hits = sum(i['hit'] for i in identity)
    lines = [f'Hits answering token for token as a fresh prefill (fp32, alpha* = 0): '
             f'**{same}/{hits}**.', '', '| context | placement | hit | identical |',
             '|---|---|---|---|']
    for i in identity:
        lines.append(f"| ~{i['context_tokens']} | {i['placement']} | {i['hit']} | "
                     f"{i['identical']} |")
    return lines


def _rotation(rotation, stats):
    hits = sum(r['cached_tokens'] > 0 for r in rotation)
    peak = max(r['store_bytes'] for r in rotation)
    hit_s = _mean([r['prefill_s'] for r in rotation if r['cached_tokens']])
    miss_s = _mean([r['prefill_s'] for r in rotation if not r['cached_tokens']])
    return [f"{len(rotation)} goals over {len({r['context'] for r in rotation})} contexts: "
            f"{hits} hits ({hits / len(rotation):.0%}); store at most {peak / 2 ** 20:.1f} MiB "
            f"of the {stats['max_bytes'] / 2 ** 20:.0f} MiB bound after any goal; "
            f"{stats['inserted_blocks']} blocks stored, {stats['dropped_blocks']} dropped; "
            f'mean prefill of hits {hit_s:.2f} s, of misses {miss_s:.2f} s.']


def write_plot(data, path):
    """Write a PNG: follow-ups' prefill and smallest on-time budget, with and without reuse."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    sizes = sorted({g['context_tokens'] for g in data['goals']})
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    for reuse, style in ((True, 'o-'), (False, 's--')):
        label = 'reuse' if reuse else 'no reuse'
        left.plot(sizes, [_mean([g['prefill_s'] for g in data['goals']
                                 if g['kind'] == 'follow-up' and g['reuse'] is reuse
                                 and g['context_tokens'] == n]) for n in sizes],
                  style, label=label)
        right.plot(sizes, [_mean([b['smallest_budget_s'] for b in data['smallest_budgets']
                                  if b['reuse'] is reuse and b['context_tokens'] == n])
                           for n in sizes], style, label=label)
    right.axhline(data['args']['kill_budget_s'], color='grey', lw=0.8, ls=':')
    left.set(xlabel='shared context, tokens', ylabel='follow-up prefill, s (mean)')
    right.set(xlabel='shared context, tokens', ylabel='smallest on-time budget, s (mean)')
    for axis in (left, right):
        axis.legend()
        axis.grid(alpha=0.3)
    figure.suptitle(f"Prefix reuse, Kill ({data['host']}, {data['date']})", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def write_report(data, path):
    """Write the Markdown tables of ``data`` (run_prefixbench's) to ``path``."""
    goals = data['goals']
    kill = [g for g in goals if g['kind'] == 'kill-budget']
    parts = ['# Prefix reuse: follow-up questions over a shared context',
             '', f"Host {data['host']} ({data['cpu']}), {data['date']}; command: "
             f"`timebill prefixbench` with {data['args']['set'] or 'the default parameters'}, "
             f"max_new_tokens {data['args']['max_new_tokens']}, Kill budget "
             f"{data['args']['kill_budget_s']} s. Fallback length predictor (N^ = N_max).",
             '', '![prefill and smallest budget](prefix.png)',
             '', '## Follow-up questions: prefill and total time', '', *_follow_ups(goals),
             '', '## Budgets under Kill', '', *_budgets(data['smallest_budgets'], kill),
             '', '## The time model on hits and misses', '', *_model(goals),
             '', '## Answers with reuse', '', *_identity(data['identity']),
             '', '## Memory bound and hit rate', '',
             *_rotation(data['rotation'], data['rotation_stats']), '']
    with open(path, 'w', encoding='utf-8') as stream:
        stream.write('\n'.join(parts))
    write_plot(data, os.path.join(os.path.dirname(path), 'prefix.png'))
