"""Baseline response-length predictors on synthetic examples (no LLM): rules, LR, RT-LM MLP."""

import numpy as np
import pytest
import torch

from timebill_ros.training.dataset import Example
from timebill_ros.training.heads.input_length_lr import InputLengthLR
from timebill_ros.training.heads.rtlm_mlp import RtlmMlpModel
from timebill_ros.training.rules import RULE_NAMES, rule_scores

N_MODEL = 512  # tokens

# RT-LM Table I: one example per uncertainty type, in RULE_NAMES order.
TABLE_I = (
    'John saw a boy in the park with a telescope.',
    'Rice flies like sand.',
    'What\u2019s the best way to deal with bats?',
    'Tell me about the history of art.',
    'What are the causes and consequences of poverty in developing countries?',
    'How do cats and dogs differ in behavior, diet, and social interaction?',
)
PLAIN = 'Is the door open?'


@pytest.fixture(autouse=True)
def one_thread():
    """Run torch on one CPU thread (the CI machine is shared), then restore the setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def ex(prompt='Is it on?', n_tokens=10, n_prompt_tokens=20, n_model=N_MODEL, pid='p'):
    """Return an Example; lengths in tokens."""
    return Example(pid, 'synthetic', 'train', prompt, n_tokens, n_tokens >= n_model,
                   n_prompt_tokens, n_model)


def planted(n, seed):
    """Return n examples: vague prompts answered at n_model tokens, yes/no ones in ~5 tokens.

    Prompt lengths are drawn independently of the kind, so only the rule scores tell them apart.
    """
    rng = np.random.default_rng(seed)
    topics = ['lidar', 'SLAM', 'odometry', 'robots', 'GPS', 'drones', 'maps', 'sensors']
    out = []
    for i in range(n):
        topic = topics[i % len(topics)]
        n_prompt = int(rng.integers(20, 60))
        if rng.random() < 0.5:
            prompt, n_tokens = f'Tell me about the history of {topic} in general.', N_MODEL
        else:
            prompt, n_tokens = f'Is the {topic} module on?', int(rng.integers(2, 9))
        out.append(ex(prompt, n_tokens, n_prompt, pid=f's{seed}-{i}'))
    return out


def test_rule_scores_shape_and_finite():
    for text in TABLE_I + (PLAIN, '', '???'):
        scores = rule_scores(text)
        assert scores.shape == (len(RULE_NAMES),) == (6,)
        assert np.all(np.isfinite(scores)) and np.all(scores >= 0)


def test_each_table_i_example_fires_its_own_rule():
    for name, text in zip(RULE_NAMES, TABLE_I):
        assert rule_scores(text)[RULE_NAMES.index(name)] > 0, (name, text)
    assert not rule_scores(PLAIN).any()


def test_rule_scores_named_examples():
    vague, multi, semantic = (RULE_NAMES.index(n) for n in ('vague', 'multi_part', 'semantic'))
    assert rule_scores(TABLE_I[3])[vague] > rule_scores(PLAIN)[vague]
    assert rule_scores(TABLE_I[5])[multi] > 0
    assert rule_scores(TABLE_I[2])[semantic] > 0
    assert rule_scores('What is the best way to deal with a cat?')[semantic] == 0


def test_rule_weights_scale_scores_and_are_checked():
    base = rule_scores(TABLE_I[3])
    scaled = rule_scores(TABLE_I[3], {'vague': 2.5})
    np.testing.assert_allclose(scaled[3], 2.5 * base[3])
    with pytest.raises(ValueError, match='nonsense'):
        rule_scores(PLAIN, {'nonsense': 1.0})
    with pytest.raises(ValueError, match='vague'):
        rule_scores(PLAIN, {'vague': float('inf')})
    with pytest.raises(TypeError, match='NoneType'):
        rule_scores(None)


def test_input_length_lr_recovers_planted_line_and_clips():
    train = [ex(n_tokens=3 * p + 10, n_prompt_tokens=p, n_model=1000, pid=str(p))
             for p in range(10, 100, 7)]
    model = InputLengthLR()
    model.fit(train, [])
    assert model.slope == pytest.approx(3.0, rel=1e-9)
    assert model.intercept == pytest.approx(10.0, rel=1e-9)
    pred = model.predict_tokens([ex(n_prompt_tokens=50, n_model=1000),
                                 ex(n_prompt_tokens=400, n_model=1000),
                                 ex(n_prompt_tokens=50, n_model=64)])
    np.testing.assert_allclose(pred, [160.0, 1000.0, 64.0])
    assert InputLengthLR.name == 'input-length LR'


def test_input_length_lr_rejects_bad_input():
    with pytest.raises(ValueError, match='train is empty'):
        InputLengthLR().fit([], [])
    with pytest.raises(ValueError, match='distinct n_prompt_tokens'):
        InputLengthLR().fit([ex(n_prompt_tokens=7), ex(n_prompt_tokens=7)], [])
    with pytest.raises(ValueError, match='n_tokens=0'):
        InputLengthLR().fit([ex(n_tokens=0, pid='zero'), ex(n_prompt_tokens=3)], [])
    with pytest.raises(TypeError, match='str'):
        InputLengthLR().fit('Is it on?', [])
    with pytest.raises(RuntimeError, match='fit'):
        InputLengthLR().predict_tokens([ex()])


def test_rtlm_mlp_learns_planted_relation_better_than_the_mean():
    train, val, test = planted(200, 1), planted(40, 2), planted(60, 3)
    model = RtlmMlpModel(seed=0, max_epochs=150, patience=20)
    model.fit(train, val)
    y = np.array([e.n_tokens for e in test], dtype=float)
    pred = model.predict_tokens(test)
    mean_mae = np.abs(np.mean([e.n_tokens for e in train]) - y).mean()
    mlp_mae = np.abs(pred - y).mean()
    assert mlp_mae < 0.2 * mean_mae, (mlp_mae, mean_mae)
    assert 1 <= model.best_epoch <= model.epochs_run <= 150


def test_rtlm_mlp_is_deterministic_and_clipped():
    train, val = planted(80, 4), planted(20, 5)
    preds = []
    with torch.random.fork_rng(devices=[]):
        for global_seed, seed in ((1, 7), (2, 7), (1, 8)):
            torch.manual_seed(global_seed)  # the model must not depend on the global RNG
            model = RtlmMlpModel(hidden=16, seed=seed, max_epochs=40, patience=40)
            model.fit(train, val)
            preds.append(model.predict_tokens(val))
    np.testing.assert_array_equal(preds[0], preds[1])
    assert not np.array_equal(preds[0], preds[2])  # the seed matters
    small = [ex('Is the lidar module on?', 2, 30, n_model=8),
             ex('Tell me about the history of SLAM in general.', 8, 30, n_model=8)]
    pred = model.predict_tokens(small + val)
    n_model = np.array([e.n_model for e in small + val], dtype=float)
    assert np.all(pred >= 1.0) and np.all(pred <= n_model)
    assert pred[0] == 1.0  # a ~5/512 share of 8 tokens is below one token
    assert model.predict_tokens([]).shape == (0,)


def test_rtlm_mlp_rejects_bad_input():
    with pytest.raises(ValueError, match='hidden must be >= 1, got 0'):
        RtlmMlpModel(hidden=0)
    with pytest.raises(TypeError, match='hidden'):
        RtlmMlpModel(hidden=2.5)
    with pytest.raises(ValueError, match='lr'):
        RtlmMlpModel(lr=-1e-3)
    with pytest.raises(ValueError, match='lr'):
        RtlmMlpModel(lr=float('nan'))
    with pytest.raises(ValueError, match='seed'):
        RtlmMlpModel(seed=-1)
    with pytest.raises(ValueError, match='max_epochs'):
        RtlmMlpModel(max_epochs=0)
    with pytest.raises(ValueError, match='train is empty'):
        RtlmMlpModel().fit([], [ex()])
    with pytest.raises(ValueError, match="'big'.*n_tokens=600"):
        RtlmMlpModel().fit([ex(n_tokens=600, pid='big')], [])
    with pytest.raises(ValueError, match='val.*n_model=0'):
        RtlmMlpModel().fit([ex()], [ex(n_model=0)])
    with pytest.raises(RuntimeError, match='fit'):
        RtlmMlpModel().predict_tokens([ex()])
    assert RtlmMlpModel.name == 'rt-lm rules+mlp'
