"""Aggregation of benchmark rows: completion, misses, ROUGE-L (incomplete = 0), alpha*."""

import pytest

from timebill_ros import prompts
from timebill_ros.bench import timebill as bench
from timebill_ros.bench.server_process import write_params


def _row(status, response, met=True, alpha=0.0, decided=True, prompt='p1'):
    return {'method': 'timebill', 'policy': 'kill', 'fraction': 1.0, 'prompt': prompt,
            'status': status, 'response': response, 'deadline_met': met, 'alpha': alpha,
            'decided': decided}


def test_summarize_scores_only_on_time_completions():
    refs = {'p1': 'go to the dock then charge'}
    rows = [_row(1, 'go to the dock then charge', alpha=0.5),
            _row(1, 'go to the dock then charge', met=False, alpha=0.5),
            _row(2, '', met=False, alpha=0.9),
            _row(3, '', met=False, decided=False)]
    (summary,) = bench.summarize(rows, refs)
    assert summary['completion_rate'] == pytest.approx(0.25)
    assert summary['misses'] == 3
    assert summary['rouge_l'] == pytest.approx(0.25)
    assert summary['mean_alpha'] == pytest.approx((0.5 + 0.5 + 0.9) / 3)


def test_budgets_scale_the_vanilla_estimate(smollm2_tokenizer):
    class Coeffs:
        def prefill_s(self, n_x):
            return 0.001 * n_x

        def decode_phase_s(self, n_x, alpha, n_tokens):
            return 0.05 * (n_tokens - 1)

    class Encoder:
        def encode(self, prompt):
            return smollm2_tokenizer(prompt)['input_ids']

    prompt_set = prompts.benchmark_prompts(quick=True)
    out = bench._budgets(prompt_set, Coeffs(), Encoder(), bench.N_MAX)
    assert set(out) == set(bench.BUDGET_FRACTIONS)
    name, prompt, t_full = out[1.0][0]
    assert t_full == pytest.approx(0.001 * len(Encoder().encode(prompt))
                                   + 0.05 * (bench.N_MAX - 1), abs=1e-3)
    assert out[0.9][0][2] == pytest.approx(0.9 * t_full, abs=2e-3)


def test_long_prompts_reach_a_few_thousand_tokens(smollm2_tokenizer):
    longest = max(len(smollm2_tokenizer(p)['input_ids'])
                  for _, p in prompts.benchmark_prompts())
    assert 2000 < longest < 4000


def test_rlp_test_prompts_are_held_out_and_varied():
    from timebill_ros.training.corpus import build_corpus
    test_ids = {it.prompt_id for it in build_corpus() if it.split == 'test'}
    chosen = bench.rlp_test_prompts()
    assert len(chosen) == bench.RLP_TEST_PROMPTS and chosen == bench.rlp_test_prompts()
    assert {pid for pid, _ in chosen} <= test_ids
    assert len({pid.split('-')[0] for pid, _ in chosen}) == len(chosen)


def test_methods_pick_their_predictor():
    by_name = {m[0]: m for m in bench.METHODS}
    assert by_name['timebill'][3] == 'rlp' and by_name['timebill-fallback'][3] == 'fallback'
    assert all(m[3] == 'fallback' for m in bench.METHODS if m[1] == 'fixed')


def test_predictor_breakdown_splits_by_predicted_length():
    def row(method, prompt, n_hat, status, alpha, response):
        return {'method': method, 'policy': 'kill', 'fraction': 1.0, 'prompt': prompt,
                'predicted_tokens': n_hat, 'status': status, 'deadline_met': status == 1,
                'alpha': alpha, 'response': response}
    raw = {'refs': {'a': 'yes it is', 'b': 'go left then right'}, 'rows': [
        row('timebill', 'a', 16, 1, 0.0, 'yes it is'),
        row('timebill-fallback', 'a', 64, 1, 0.9, 'yes'),
        row('timebill', 'b', 64, 2, 0.5, ''),
        row('timebill-fallback', 'b', 64, 1, 0.5, 'go left then right')]}
    out = bench.predictor_breakdown(raw)
    assert out['short']['jobs'] == 1 and out['short']['rouge_l'][0] == 1.0
    assert out['short']['rouge_l'][1] < 1.0 and out['short']['alpha'] == (0.0, 0.9)
    assert out['n_max']['done'] == (0.0, 1.0)


def test_the_fixed_method_decides_as_before_issue_9(tmp_path):
    from timebill_ros import params
    configs = {}
    for method in bench.METHODS:
        path = write_params(tmp_path, method[0], bench.server_flat(method), 48)
        configs[method[0]] = params.config_from_flat(params.load_yaml(path))
    fixed, online = configs['timebill-fixed'], configs['timebill']
    assert fixed.timing.online is False and fixed.admission.policy == 'none'
    assert online.timing.online is True and online.admission.policy == 'feasibility'
    assert fixed.predictor.kind == online.predictor.kind == 'rlp'
    clamp = configs['timebill-clamp']
    assert (fixed.budget.expected_fallback, clamp.budget.expected_fallback) == (False, False)
    assert online.budget.expected_fallback is True
    assert (fixed.budget.keep_cache_when_hopeless, clamp.budget.keep_cache_when_hopeless,
            online.budget.keep_cache_when_hopeless) == (False, False, True)
    assert clamp.timing.online is True and clamp.admission.policy == 'feasibility'
    # timebill reads N^ from its prefill (the server default); timebill-rlp runs the RLP.
    assert online.predictor.prefill_readout is True
    assert configs['timebill-rlp'].predictor.prefill_readout is False
    # No two servers share an online state file: methods must not learn from each other.
    assert len({c.timing.state_file for c in configs.values()}) == len(configs)
