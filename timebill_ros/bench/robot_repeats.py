"""Robot-context runs repeated on independently calibrated servers: spread and the online check.

``timebill bench --workload robot-context --repeats RAW.json RAW.json ... --out DIR`` reads
the raw rows of runs made by separate ``timebill bench --workload robot-context`` commands
(each its own start-up calibration, Vanilla pass and servers) and writes ``repeats.md``:

* per policy, budget and method: the mean score of each repeat with its 95 % bootstrap
  interval over items, and the spread between the repeats (max - min of the means), so a
  difference between methods can be set against both;
* timebill-online's check per repeat: within the interval of the best method wherever some
  method completes >= 50 % of the jobs, and >= Vanilla - 0.01 at the largest budget;
* the paired difference timebill-online - TimeBill per item (same items, same budget) with
  its bootstrap interval, per repeat; the same against timebill-online-prefill where a run
  has it (what the decode readout changes);
* t^_WCET against the run (total - queue) of completed jobs: coverage and the median ratio
  at admission and at the last checkpoint, per budget and over all budgets; the same per way
  the answer ended (EOS, the loop guard, max_new_tokens), with the last checkpoint's
  coverage and N^_rem error.
"""

import json
import pathlib

import numpy as np

from timebill_ros.bench import scores
from timebill_ros.engine import stopping
from timebill_ros.bench.robot_bench import score_lines
from timebill_ros.bench.timebill import _rouge_l_scorer
from timebill_ros.server import outcome

ONLINE, ONE_SHOT, VANILLA = 'timebill-online', 'timebill', 'vanilla'
ONLINE_PREFILL = 'timebill-online-prefill'  # timebill-online without its decode readout
VANILLA_SLACK = 0.01  # the check at the largest budget: >= Vanilla - this


def online_check(lines):
    """Return the check's verdict per (policy, fraction) of one run.

    Each entry: policy, fraction, counted (some method completes >= 50 %), best (online's
    mean >= the best method's interval low), vanilla_gap (online - Vanilla, at the largest
    budget only, else None), holds: best (or not counted) below the largest budget,
    vanilla_gap >= -0.01 at it.
    """
    best = scores.best_within_interval(lines, ONLINE)
    out = []
    for policy in sorted({line['policy'] for line in lines}):
        fractions = sorted({line['fraction'] for line in lines if line['policy'] == policy})
        for fraction in fractions:
            here = {line['method']: line for line in lines
                    if (line['policy'], line['fraction']) == (policy, fraction)}
            if ONLINE not in here:
                continue
            counted = max(line['completion'][0] for line in here.values()) >= 0.5
            gap = None
            if fraction == fractions[-1] and VANILLA in here:
                gap = here[ONLINE]['score'][0] - here[VANILLA]['score'][0]
            # At the largest budget the best method is Vanilla itself, whose interval is
            # [1, 1] (it is the reference): any one evicted goal leaves that interval, so the
            # issue's check there is >= Vanilla - 0.01; "best" is reported beside it.
            holds = (gap >= -VANILLA_SLACK if gap is not None
                     else not counted or best[(policy, fraction)])
            out.append({'policy': policy, 'fraction': fraction, 'counted': counted,
                        'best': best[(policy, fraction)], 'vanilla_gap': gap, 'holds': holds})
    return out


def paired_differences(raw, similarity, method=ONLINE, other=ONE_SHOT):
    """Return [(policy, fraction, mean, low, high)]: per-item ``method`` - ``other`` scores."""
    vanilla = raw['vanilla']
    by_key = {}
    for row in raw['rows']:
        by_key[(row['policy'], row['fraction'], row['method'], row['item'])] = row
    items = sorted(raw['items'])
    draws = scores.bootstrap_draws(len(items))
    out = []
    for policy, fraction in sorted({(r['policy'], r['fraction']) for r in raw['rows']}):
        pairs = [(by_key.get((policy, fraction, method, item)),
                  by_key.get((policy, fraction, other, item))) for item in items]
        if any(a is None or b is None for a, b in pairs):
            continue
        diffs = [scores.job_score(a, similarity, vanilla[a['item']]['response'])
                 - scores.job_score(b, similarity, vanilla[b['item']]['response'])
                 for a, b in pairs]
        out.append((policy, fraction, *scores.bootstrap_interval(diffs, draws)))
    return out


def wcet_lines(raw, method=ONLINE):
    """Return [(policy, fraction, n, coverage, median at admission, median at the last)].

    Over completed jobs of ``method``; the run is total - queue (what t^_WCET bounds). The
    last checkpoint's ratio is (its t^_WCET) / run; None where no job had a checkpoint. Each
    policy ends with its jobs of every budget pooled (fraction None).
    """
    return [(policy, fraction, *_wcet_ratios(done))
            for policy, fraction, done in _by_budget(_completed_with_wcet(raw, method))]


def wcet_by_end(raw, method=ONLINE):
    """Return :func:`wcet_lines`' figures per way the answer ended, with the last checkpoint's.

    Each entry: (policy, fraction, end, n, coverage, median at admission, median at the
    last, covered at the last checkpoint, jobs with a checkpoint, median N^_rem error in
    tokens or None). end: :func:`answer_end`.
    """
    out = []
    for policy, fraction, done in _by_budget(_completed_with_wcet(raw, method)):
        for end in sorted({answer_end(r) for r in done}):
            ended = [r for r in done if answer_end(r) == end]
            out.append((policy, fraction, end, *_wcet_ratios(ended), *_last_checkpoint(ended)))
    return out


def answer_end(row):
    """Return how a completed job's answer ended: a stopping reason, from its message.

    The server's words for EOS, a stop string and the loop guard (outcome.STOP_WORDS); any
    other completed answer reached max_new_tokens.
    """
    for reason, words in outcome.STOP_WORDS.items():
        if words in row['message']:
            return reason
    return stopping.MAX_TOKENS


def _completed_with_wcet(raw, method):
    """Return the completed jobs of ``method`` that carry a t^_WCET."""
    return [r for r in raw['rows'] if r['method'] == method and scores.completed(r)
            and r.get('predicted_wcet_s', 0) > 0]


def _by_budget(rows):
    """Yield (policy, fraction, rows) per budget, then per policy over all (fraction None)."""
    for policy in sorted({r['policy'] for r in rows}):
        fractions = sorted({r['fraction'] for r in rows if r['policy'] == policy})
        for fraction in fractions + [None]:
            yield policy, fraction, [r for r in rows if r['policy'] == policy
                                     and fraction in (None, r['fraction'])]


def _last_checkpoint(done):
    """Return (covered at the last checkpoint, jobs with one, median N^_rem error or None)."""
    run = [r['total_s'] - r.get('queue_s', 0.0) for r in done]
    last = [(r, t) for r, t in zip(done, run) if r.get('checkpoint_wcet_s')]
    errors = [r['rest_error_tokens'] for r, _ in last if 'rest_error_tokens' in r]
    return (sum(r['checkpoint_wcet_s'][-1] >= t for r, t in last), len(last),
            float(np.median(errors)) if errors else None)


def _wcet_ratios(done):
    """Return (n, coverage, median at admission, median at the last checkpoint or None)."""
    run = [r['total_s'] - r.get('queue_s', 0.0) for r in done]
    admission = [r['predicted_wcet_s'] / t for r, t in zip(done, run)]
    last = [r['checkpoint_wcet_s'][-1] / t for r, t in zip(done, run)
            if r.get('checkpoint_wcet_s')]
    return (len(done), float(np.mean([a >= 1.0 for a in admission])),
            float(np.median(admission)), float(np.median(last)) if last else None)


def report(raw_paths, out_dir):
    """Write ``repeats.md`` for the runs' raw JSON files; return its lines."""
    similarity = _rouge_l_scorer()
    runs = [json.loads(pathlib.Path(p).read_text(encoding='utf-8')) for p in raw_paths]
    lines = [score_lines(raw, similarity)[0] for raw in runs]
    text = [f'# Robot contexts, {len(runs)} repeats on independently calibrated servers', '',
            'Rebuilt from the raw rows by `timebill bench --workload robot-context --repeats '
            + ' '.join(str(p) for p in raw_paths) + ' --out DIR`.', '']
    text += _score_table(lines) + ['']
    text += ['## The check of timebill-online, per repeat', '',
             '| repeat | policy | T / t_v | counted | best within CI | - Vanilla | holds |',
             '|---|---|---|---|---|---|---|']
    for index, run_lines in enumerate(lines, 1):
        for v in online_check(run_lines):
            gap = '-' if v['vanilla_gap'] is None else f"{v['vanilla_gap']:+.3f}"
            text.append(f"| {index} | {v['policy']} | {v['fraction']:.2f} | {v['counted']} | "
                        f"{v['best']} | {gap} | {v['holds']} |")
    for other, title in ((ONE_SHOT, 'TimeBill'),
                         (ONLINE_PREFILL, 'timebill-online-prefill (the decode readout\'s '
                          'effect)')):
        text += _paired_table(runs, similarity, other, title)
    text += ['', '## t^_WCET of completed timebill-online jobs against their run', '',
             '| repeat | policy | T / t_v | jobs | coverage | median t^_WCET / run at '
             'admission | ... at the last checkpoint |', '|---|---|---|---|---|---|---|']
    for index, raw in enumerate(runs, 1):
        for policy, fraction, n, cover, admission, last in wcet_lines(raw):
            last_text = '-' if last is None else f'{last:.2f}'
            budget = 'all' if fraction is None else f'{fraction:.2f}'
            text.append(f'| {index} | {policy} | {budget} | {n} | {cover:.3f} | '
                        f'{admission:.2f} | {last_text} |')
    text += _by_end_table(runs)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / 'repeats.md').write_text('\n'.join(text) + '\n', encoding='utf-8')
    print('\n'.join(text))
    return text


def _by_end_table(runs):
    """Return the t^_WCET table of completed timebill-online jobs by how the answer ended."""
    text = ['', '## ... by how the answer ended', '',
            'The last checkpoint: jobs whose run its t^_WCET covers, of those with one; the '
            'N^_rem error: its predicted tokens still to come minus those generated (rows of '
            'code before 4b3bc11 counted the tokens a loop\'s cut kept instead).', '',
            '| repeat | policy | T / t_v | ended by | jobs | coverage | median at admission | '
            '... at the last checkpoint | last checkpoint covers | median N^_rem error |',
            '|---|---|---|---|---|---|---|---|---|---|']
    for index, raw in enumerate(runs, 1):
        for (policy, fraction, end, n, cover, admission, last, covered, n_last,
             error) in wcet_by_end(raw):
            budget = 'all' if fraction is None else f'{fraction:.2f}'
            last_text = '-' if last is None else f'{last:.2f}'
            error_text = '-' if error is None else f'{error:.0f}'
            text.append(f'| {index} | {policy} | {budget} | {end} | {n} | {cover:.3f} | '
                        f'{admission:.2f} | {last_text} | {covered} of {n_last} | '
                        f'{error_text} |')
    return text


def _paired_table(runs, similarity, other, title):
    """Return the per-item paired difference timebill-online - ``other`` per repeat.

    Empty where no run has ``other``'s rows.
    """
    rows = [(index, *line) for index, raw in enumerate(runs, 1)
            for line in paired_differences(raw, similarity, other=other)]
    if not rows:
        return []
    text = ['', f'## Paired difference timebill-online - {title} (per item), per repeat', '',
            '| repeat | policy | T / t_v | mean [95 % CI] |', '|---|---|---|---|']
    for index, policy, fraction, mean, low, high in rows:
        text.append(f'| {index} | {policy} | {fraction:.2f} | {mean:+.3f} '
                    f'[{low:+.3f}, {high:+.3f}] |')
    return text


def _score_table(lines):
    """Return the table of each repeat's mean score [interval] and the spread of the means."""
    keys = sorted({(l_['policy'], l_['fraction'], l_['method']) for run in lines
                   for l_ in run})
    head = ' | '.join(f'repeat {i}' for i in range(1, len(lines) + 1))
    text = ['## Score (ROUGE-L against the full-cache answer) and completion', '',
            f'| policy | T / t_v | method | {head} | spread of the means | completion |',
            '|---|---|---|' + '---|' * len(lines) + '---|---|']
    for key in keys:
        found = [next((l_ for l_ in run if (l_['policy'], l_['fraction'], l_['method']) == key),
                      None) for run in lines]
        cells = ['-' if f is None else f"{f['score'][0]:.3f} [{f['score'][1]:.3f}, "
                 f"{f['score'][2]:.3f}]" for f in found]
        means = [f['score'][0] for f in found if f is not None]
        done = ' / '.join(f"{f['completion'][0]:.2f}" for f in found if f is not None)
        text.append(f'| {key[0]} | {key[1]:.2f} | {key[2]} | ' + ' | '.join(cells)
                    + f' | {max(means) - min(means):.3f} | {done} |')
    return text
