"""The scheduling benchmark's workload: the prompt pool, its subsets, and the arrival traces."""

import math

import numpy as np

SUBSETS = ('small', 'medium', 'large')
SLACK = (1.5, 4.0)
GOALS = 24
N_MAX = 128
MAX_PROMPT_TOKENS = 1024
DEFAULT_LENGTHS = 'data/rlp/lengths.jsonl'


def load_pool(lengths_path=DEFAULT_LENGTHS, goals=GOALS, max_prompt_tokens=MAX_PROMPT_TOKENS,
              examples=None, split='test'):
    """Return the held-out prompts the subsets are drawn from (training.dataset.Example list).

    split ``test``: the test split, joined by the val split when test has fewer than
    ``2 * goals`` prompts of at most ``max_prompt_tokens`` chat-formatted tokens (0 = no
    limit). split ``val``: the val split alone (to tune on prompts the evaluation does not
    use). ``examples``: a ``{split: [Example]}`` to use instead of reading ``lengths_path``.
    """
    if split not in ('test', 'val'):
        raise ValueError(f'split must be test or val, got {split!r}')
    if examples is None:
        from timebill_ros.training.dataset import load_examples
        examples = load_examples(lengths_path)

    def fits(example):
        return not max_prompt_tokens or example.n_prompt_tokens <= max_prompt_tokens

    pool = [e for e in examples.get(split, []) if fits(e)]
    if split == 'test' and len(pool) < 2 * goals:
        pool += [e for e in examples.get('val', []) if fits(e)]
    if len(pool) < goals:
        raise ValueError(f'only {len(pool)} held-out prompts of at most {max_prompt_tokens} '
                         f'tokens; {goals} goals a subset need more')
    return pool


def make_subsets(pool, goals=GOALS, seed=0, names=SUBSETS):
    """Return {name: [Example]}: ``goals`` prompts of small / medium / large length variance.

    small: the prompts whose response length N lies closest to the pool's median N.
    medium: one prompt drawn from each of ``goals`` equal strata of the pool sorted by N (the
    pool's own distribution of N: RT-LM's "normal" variance).
    large: the ``goals // 2`` shortest and the rest from the longest.
    Ties of N are broken by a permutation drawn from ``seed``, so a seed picks different
    prompts of the same lengths. Each subset is listed by increasing N.
    """
    if len(pool) < goals:
        raise ValueError(f'the pool has {len(pool)} prompts, fewer than {goals} goals')
    unknown = sorted(set(names) - set(SUBSETS))
    if unknown:
        raise ValueError(f'unknown subset(s) {unknown}; known: {list(SUBSETS)}')
    rng = np.random.default_rng(seed)
    tie = dict(zip((e.prompt_id for e in pool), rng.permutation(len(pool)).tolist()))
    ranked = sorted(pool, key=lambda e: (e.n_tokens, tie[e.prompt_id]))
    median = float(np.median([e.n_tokens for e in pool]))
    out = {}
    if 'small' in names:
        out['small'] = sorted(pool, key=lambda e: (abs(e.n_tokens - median),
                                                   tie[e.prompt_id]))[:goals]
    if 'medium' in names:
        bounds = np.linspace(0, len(ranked), goals + 1)
        picks = [int(rng.integers(math.ceil(lo), max(math.ceil(lo) + 1, math.ceil(hi))))
                 for lo, hi in zip(bounds[:-1], bounds[1:])]
        out['medium'] = [ranked[i] for i in picks]
    if 'large' in names:
        out['large'] = ranked[:goals // 2] + ranked[len(ranked) - (goals - goals // 2):]
    return {name: sorted(out[name], key=lambda e: (e.n_tokens, tie[e.prompt_id]))
            for name in names}


def subset_stats(items):
    """Return the response-length (N) and prompt-length (N_x) figures of a subset, tokens."""
    lengths = [e.n_tokens for e in items]
    prompts = [e.n_prompt_tokens for e in items]
    median = float(np.median(lengths))
    return {'goals': len(items), 'mean': float(np.mean(lengths)),
            'std': float(np.std(lengths)), 'min': min(lengths), 'max': max(lengths),
            'median': median, 'capped': sum(bool(e.capped) for e in items),
            'short': sum(n < median for n in lengths),
            'prompt_mean': float(np.mean(prompts)), 'prompt_max': max(prompts)}


def predicted_service_s(coefficients, n_x, n_tokens, n_max=N_MAX):
    """Return t^_e2e, seconds: prefill of N_x tokens and min(N, N_max) tokens decoded."""
    return coefficients.prefill_s(n_x) + coefficients.decode_phase_s(
        n_x, 0.0, min(n_tokens, n_max))


def make_trace(items, base_s, rate_per_s, slack=SLACK, seed=0):
    """Return the goals of one trace in order of arrival: [{index, arrival_s, slack, budget_s}].

    Poisson arrivals at ``rate_per_s`` goals per second (the first at 0); budget = the goal's
    ``base_s`` (t^_e2e, ``capacity.budget_bases``) x a slack factor uniform in ``slack``. The
    goal order, the factors and the unit exponential gaps come from ``seed`` alone, so the
    same seed at another rate gives the same goals with arrival times scaled by the ratio of
    the rates.
    """
    if rate_per_s <= 0:
        raise ValueError(f'rate_per_s must be > 0, got {rate_per_s!r}')
    low, high = slack
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(items))
    gaps = rng.exponential(1.0, len(items))
    factors = rng.uniform(low, high, len(items))
    arrivals = (np.cumsum(gaps) - gaps[0]) / rate_per_s
    return [{'index': int(i), 'arrival_s': float(t), 'slack': float(f),
             'budget_s': round(float(f) * base_s[i], 3)}
            for i, t, f in zip(order, arrivals, factors)]


def trace_seed(seed, subset, repeat):
    """Return the numpy seed of the traces of (subset, repeat): independent of the load."""
    return [int(seed), SUBSETS.index(subset), int(repeat)]
