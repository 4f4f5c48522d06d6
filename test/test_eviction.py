"""Tests of the KV-cache scorers and of the choice of kept positions."""

import pytest
import torch

from timebill_ros.config import EvictionConfig
from timebill_ros.engine.eviction import (KnormScorer, SnapKVScorer, StreamingLLMScorer,
                                          gather_positions, keep_indices, make_scorer, n_keep_for)
from timebill_ros.engine.stopping import StopCriteria

PROMPT = 'Explain in two short paragraphs why the sky is blue and why sunsets are red.'


def test_make_scorer_by_name():
    """make_scorer picks the scorer class by name."""
    assert isinstance(make_scorer(EvictionConfig(scorer='snapkv')), SnapKVScorer)
    assert isinstance(make_scorer(EvictionConfig(scorer='streaming_llm')), StreamingLLMScorer)
    assert isinstance(make_scorer(EvictionConfig(scorer='knorm')), KnormScorer)
    with pytest.raises(TypeError):
        make_scorer('snapkv')


@pytest.mark.parametrize('n_x, alpha, window, expected', [
    (100, 0.0, 8, 100), (100, 0.5, 8, 50), (100, 0.95, 8, 8), (5, 0.5, 8, 5), (10, 0.25, 2, 8),
])
def test_n_keep_for(n_x, alpha, window, expected):
    """n_keep = N_x - round(alpha N_x), clamped to [window, N_x]."""
    assert n_keep_for(n_x, alpha, window) == expected


@pytest.mark.parametrize('alpha', [-0.1, 1.0, 1.5, float('nan')])
def test_n_keep_for_rejects_bad_alpha(alpha):
    """An alpha outside [0, 1) raises ValueError."""
    with pytest.raises(ValueError, match='alpha'):
        n_keep_for(100, alpha, 8)


def test_n_keep_for_rejects_non_number():
    """A non-number alpha raises TypeError."""
    with pytest.raises(TypeError, match='alpha'):
        n_keep_for(100, '0.5', 8)


def test_keep_indices_keeps_window_and_order():
    """Top scores plus the window are kept, in original order."""
    scores = torch.tensor([[[9.0, 1.0, 8.0, 2.0, 7.0, 0.0, -5.0, -6.0]]])
    keep = keep_indices(scores, n_keep=4, window_size=2)
    assert keep.tolist() == [[[0, 2, 6, 7]]]


def test_keep_indices_rejects_bad_n_keep():
    """n_keep outside [window, N] raises ValueError."""
    with pytest.raises(ValueError, match='n_keep'):
        keep_indices(torch.zeros(1, 1, 8), n_keep=1, window_size=2)
    with pytest.raises(ValueError, match='n_keep'):
        keep_indices(torch.zeros(1, 1, 8), n_keep=9, window_size=2)


def test_gather_positions():
    """gather_positions selects positions per KV head."""
    tensor = torch.arange(2 * 6 * 3, dtype=torch.float32).reshape(1, 2, 6, 3)
    indices = torch.tensor([[[0, 5], [1, 2]]])
    out = gather_positions(tensor, indices)
    assert out.shape == (1, 2, 2, 3)
    assert torch.equal(out[0, 0, 1], tensor[0, 0, 5])
    assert torch.equal(out[0, 1, 0], tensor[0, 1, 1])


def _layer0_inputs(engine):
    state = engine.prefill(engine.encode(PROMPT), StopCriteria())
    keys, values = engine.layer_kv(state, 0)
    return state, state.scorer_inputs[0], keys, values


@pytest.mark.parametrize('name', ['snapkv', 'streaming_llm', 'knorm'])
def test_scorer_shape(make_tiny_engine, name):
    """Each scorer returns finite scores of shape (B, H_kv, N_x)."""
    engine = make_tiny_engine(scorer=name)
    state, inputs, keys, values = _layer0_inputs(engine)
    scores = engine.scorer.score(inputs.module, inputs.hidden_states, keys, values,
                                 inputs.kwargs, n_keep=state.n_x // 2)
    assert scores.shape == (1, 2, state.n_x)
    assert torch.isfinite(scores).all()


def test_streaming_llm_keeps_sinks_and_recent(make_tiny_engine):
    """The StreamingLLM scorer keeps exactly the 4 sinks and the most recent tokens."""
    engine = make_tiny_engine(scorer='streaming_llm')
    state, inputs, keys, values = _layer0_inputs(engine)
    for n_keep in range(8 + 4, state.n_x):  # window + sinks
        scores = engine.scorer.score(inputs.module, inputs.hidden_states, keys, values,
                                     inputs.kwargs, n_keep=n_keep)
        keep = keep_indices(scores, n_keep, 8)[0, 0].tolist()
        expected = list(range(4)) + list(range(state.n_x - (n_keep - 4), state.n_x))
        assert keep == expected


def test_snapkv_needs_more_than_window(make_tiny_engine):
    """The SnapKV scorer refuses hidden states no longer than the window."""
    engine = make_tiny_engine(scorer='snapkv')
    state, inputs, keys, values = _layer0_inputs(engine)
    with pytest.raises(ValueError, match='window_size'):
        engine.scorer.score(inputs.module, inputs.hidden_states[:, -8:], keys, values,
                            inputs.kwargs)
