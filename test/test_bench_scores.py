"""Job scores and bootstrap intervals of the benchmarks (bench/scores.py)."""

import numpy as np
import pytest

from timebill_ros.bench import scores
from timebill_ros.server.status import COMPLETED, KILLED, SKIPPED


def _same(reference, response):
    return 1.0 if reference == response else 0.5


def _row(method, item, status, met=True, policy='kill', fraction=0.5, response='a',
         alpha=0.0):
    return {'method': method, 'policy': policy, 'fraction': fraction, 'item': item,
            'status': status, 'deadline_met': met, 'response': response, 'alpha': alpha,
            'decided': True}


def test_a_miss_under_kill_and_a_skip_score_zero_a_late_skip_next_answer_counts():
    assert scores.job_score(_row('m', 'i', KILLED, met=False), _same, 'a') == 0.0
    assert scores.job_score(_row('m', 'i', COMPLETED, met=False), _same, 'a') == 0.0
    assert scores.job_score(_row('m', 'i', COMPLETED), _same, 'a') == 1.0
    late = _row('m', 'i', COMPLETED, met=False, policy='skip_next', response='b')
    assert scores.completed(late) and scores.job_score(late, _same, 'a') == 0.5
    assert scores.job_score(_row('m', 'i', SKIPPED, met=False, policy='skip_next'),
                            _same, 'a') == 0.0


def test_the_interval_holds_the_mean_and_narrows_with_more_items():
    rng = np.random.default_rng(0)
    few, many = rng.uniform(size=10), rng.uniform(size=400)
    mean, low, high = scores.bootstrap_interval(few, scores.bootstrap_draws(10))
    assert low <= mean <= high and mean == pytest.approx(few.mean())
    _, low2, high2 = scores.bootstrap_interval(many, scores.bootstrap_draws(400))
    assert high2 - low2 < (high - low) / 3
    assert scores.bootstrap_interval([1.0] * 10, scores.bootstrap_draws(10)) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match='3 values for resamples of 10 items'):
        scores.bootstrap_interval([1, 2, 3], scores.bootstrap_draws(10))
    with pytest.raises(ValueError, match='n_items must be an int >= 1'):
        scores.bootstrap_draws(0)


def test_summary_and_who_is_best_within_the_interval():
    items = [f'i{k}' for k in range(30)]
    rows = []
    for k, item in enumerate(items):
        rows.append(_row('good', item, COMPLETED, alpha=0.3))
        rows.append(_row('close', item, COMPLETED if k % 15 else KILLED, met=k % 15 != 0))
        rows.append(_row('bad', item, COMPLETED if k % 2 else KILLED, met=k % 2 == 1))
    refs = {item: 'a' for item in items}
    lines = scores.summarize(rows, refs, _same, item_references={'i0': 'a', 'i1': 'b'})
    by_method = {line['method']: line for line in lines}
    assert by_method['good']['score'] == (1.0, 1.0, 1.0)
    assert by_method['good']['mean_alpha'] == pytest.approx(0.3)
    assert by_method['good']['task_score'] == pytest.approx(0.75)
    assert by_method['bad']['completion'][0] == pytest.approx(0.5)
    assert by_method['bad']['per_completed'] == pytest.approx(1.0)  # each answer it gave
    assert by_method['good']['per_completed'] == pytest.approx(1.0)
    assert scores.best_within_interval(lines, 'good') == {('kill', 0.5): True}
    assert scores.best_within_interval(lines, 'bad') == {('kill', 0.5): False}
    assert scores.best_within_interval(lines, 'close') == {('kill', 0.5): False}
    with pytest.raises(ValueError, match='bad / kill / 0.5 ran 29 of 30 items'):
        scores.summarize([r for r in rows if not (r['method'] == 'bad' and r['item'] == 'i3')],
                         refs, _same)


def test_the_fig7_verdict_counts_budgets_where_something_completes():
    def line(method, fraction, score, completion):
        return {'policy': 'kill', 'fraction': fraction, 'method': method,
                'score': score, 'completion': completion}
    lines = [line('timebill', 0.3, (0.1, 0.0, 0.2), (0.2, 0.1, 0.3)),
             line('alpha=0.95', 0.3, (0.3, 0.2, 0.4), (0.4, 0.3, 0.5)),
             line('timebill', 0.6, (0.5, 0.4, 0.6), (0.7, 0.6, 0.8)),
             line('alpha=0.95', 0.6, (0.55, 0.45, 0.65), (0.85, 0.8, 0.9)),
             line('timebill', 1.0, (0.8, 0.7, 0.9), (0.9, 0.8, 1.0)),
             line('alpha=0.95', 1.0, (0.3, 0.2, 0.4), (0.95, 0.9, 1.0))]
    verdict = {v['fraction']: v for v in scores.fig7_verdict(lines)}
    assert not verdict[0.3]['counted'] and verdict[0.3]['holds']   # nothing completes half
    assert verdict[0.6]['best'] and not verdict[0.6]['holds']      # within, but 15 points less
    assert verdict[0.6]['gap'] == pytest.approx(0.15)
    assert verdict[1.0]['holds'] and verdict[1.0]['gap'] == pytest.approx(0.05)
