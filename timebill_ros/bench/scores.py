"""Scores of benchmark jobs and their bootstrap intervals over items (issue 42).

A job is one item (a question over its context) run by one method under one policy at one
budget. TimeBill's rules (Sec. 6): under Kill a job that misses its deadline scores 0; under
Skip-Next a skipped job scores 0 and an overrunning one is scored on what it delivered (late).
Partial delivers a truncated answer on time and is scored as it is. Means and completion rates
get 95 % percentile-bootstrap intervals over items (items resampled with replacement, the
same draws for every method, so that methods are compared on the same resamples); a method
is called better than another only where the intervals do not overlap.
"""

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from timebill_ros.server.status import COMPLETED

BOOTSTRAP_DRAWS = 2000
BOOTSTRAP_SEED = 20261127


def completed(row: dict) -> bool:
    """Return whether a job counts as completed under its policy.

    Kill and Partial: COMPLETED by the deadline. Skip-Next: COMPLETED, on time or late (the
    policy lets the overrunning job finish; the jobs it makes late are SKIPPED).
    """
    if row['status'] != COMPLETED:
        return False
    return row['policy'] == 'skip_next' or bool(row['deadline_met'])


def job_score(row: dict, similarity: Callable[[str, str], float], reference: str) -> float:
    """Return a job's score in [0, 1]: ``similarity(reference, response)`` if completed, else 0.

    reference: the full-cache answer (or the item's own reference answer).
    """
    return similarity(reference, row['response']) if completed(row) else 0.0


def bootstrap_interval(values: Sequence[float], draws: np.ndarray) -> Tuple[float, float,
                                                                            float]:
    """Return (mean, low, high): the mean of ``values`` and its 95 % bootstrap interval.

    values: one value per item, in item order; draws: (B, n_items) int indices of the
    resamples (:func:`bootstrap_draws`), shared by every method.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1 or values.size != draws.shape[1]:
        raise ValueError(f'{values.size} values for resamples of {draws.shape[1]} items')
    means = values[draws].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(values.mean()), float(low), float(high)


def bootstrap_draws(n_items: int, draws: int = BOOTSTRAP_DRAWS,
                    seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """Return (draws, n_items) indices of item resamples with replacement (seeded)."""
    if not isinstance(n_items, int) or n_items < 1:
        raise ValueError(f'n_items must be an int >= 1, got {n_items!r}')
    return np.random.default_rng(seed).integers(0, n_items, size=(draws, n_items))


def summarize(rows: List[dict], references: Dict[str, str],
              similarity: Callable[[str, str], float], item_references: Optional[dict] = None,
              draws: Optional[np.ndarray] = None) -> List[dict]:
    """Return one line per (policy, fraction, method): means and intervals over items.

    rows: jobs with ``method``, ``policy``, ``fraction``, ``item``, ``status``,
    ``deadline_met``, ``response``, ``alpha``; references: {item: full-cache answer};
    item_references: {item: its own reference answer} where it has one (scored as
    ``task_score`` over those items only). Each line: ``score`` and ``completion`` as
    (mean, low, high); ``n_items``; ``mean_alpha`` of the jobs that ran; ``task_score``;
    ``per_completed``: the mean score of the completed jobs (None: none completed), so that
    score = completion x per_completed tells a method that completes little from one whose
    answers score little.
    """
    groups: Dict[tuple, Dict[str, dict]] = {}
    for row in rows:
        groups.setdefault((row['policy'], row['fraction'], row['method']), {})[row['item']] = row
    items = sorted({row['item'] for row in rows})
    draws = bootstrap_draws(len(items)) if draws is None else draws
    lines = []
    for (policy, fraction, method), by_item in sorted(groups.items()):
        if sorted(by_item) != items:
            raise ValueError(f'{method} / {policy} / {fraction} ran {len(by_item)} of '
                             f'{len(items)} items')
        ordered = [by_item[i] for i in items]
        scores = [job_score(r, similarity, references[r['item']]) for r in ordered]
        done = [1.0 if completed(r) else 0.0 for r in ordered]
        ran = [r['alpha'] for r in ordered if r.get('decided')]
        line = {'policy': policy, 'fraction': fraction, 'method': method,
                'n_items': len(items), 'score': bootstrap_interval(scores, draws),
                'completion': bootstrap_interval(done, draws),
                'mean_alpha': float(np.mean(ran)) if ran else 0.0,
                'per_completed': (float(np.mean([s for s, d in zip(scores, done) if d]))
                                  if any(done) else None)}
        if item_references:
            own = [job_score(r, similarity, item_references[r['item']]) for r in ordered
                   if r['item'] in item_references]
            line['task_score'] = float(np.mean(own)) if own else None
        lines.append(line)
    return lines


def best_within_interval(lines: List[dict], method: str) -> Dict[tuple, bool]:
    """Return {(policy, fraction): whether ``method`` is best within the intervals}.

    True where its mean score is the highest of that (policy, fraction)'s methods, or not
    below the lower bound of the highest's interval.
    """
    out = {}
    for key in sorted({(line['policy'], line['fraction']) for line in lines}):
        here = [line for line in lines if (line['policy'], line['fraction']) == key]
        mine = [line for line in here if line['method'] == method]
        if not mine:
            continue
        best = max(here, key=lambda line: line['score'][0])
        out[key] = mine[0]['score'][0] >= best['score'][1]
    return out


def fig7_verdict(lines: List[dict], method: str = 'timebill', rival: str = 'alpha=0.95',
                 min_completion: float = 0.5, max_gap: float = 0.10) -> List[dict]:
    """Return issue 42's check per (policy, fraction): ``method`` best where it counts.

    Where any method completes >= ``min_completion`` of the jobs, ``method`` must be best
    within the intervals (:func:`best_within_interval`) at a completion rate no more than
    ``max_gap`` below ``rival``'s. Each entry: policy, fraction, counted (some method
    completes enough), best, gap (rival's completion minus the method's), holds.
    """
    best = best_within_interval(lines, method)
    out = []
    for key, is_best in best.items():
        here = {line['method']: line for line in lines
                if (line['policy'], line['fraction']) == key}
        counted = max(line['completion'][0] for line in here.values()) >= min_completion
        gap = (here[rival]['completion'][0] - here[method]['completion'][0]
               if rival in here else 0.0)
        out.append({'policy': key[0], 'fraction': key[1], 'counted': counted,
                    'best': is_best, 'gap': gap,
                    'holds': (not counted) or (is_best and gap <= max_gap)})
    return out
