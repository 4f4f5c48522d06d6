"""The preallocated KV cache (engine/kv_cache.py)."""

import pytest
import torch

from timebill_ros.engine.kv_cache import GROW_TOKENS, KvCache


def _tokens(n_tokens, start=0.0, heads=2, dim=3):
    """(1, heads, n_tokens, dim) whose entries say their token number."""
    values = torch.arange(start, start + n_tokens).view(1, 1, n_tokens, 1)
    return values.expand(1, heads, n_tokens, dim).clone()


def test_append_writes_in_place_and_grows_past_its_capacity():
    cache = KvCache(n_layers=2, n_kv_heads=2, head_dim=3, dtype=torch.float32)
    assert cache.capacity(0) == GROW_TOKENS and cache.get_seq_length(1) == 0
    buffer = cache.keys[0]
    keys, values = cache.append(0, _tokens(10), -_tokens(10))
    assert cache.keys[0] is buffer  # no copy while it fits
    assert keys.shape == (1, 2, 10, 3) and torch.equal(values, -_tokens(10))
    cache.append(0, _tokens(GROW_TOKENS, start=10), _tokens(GROW_TOKENS, start=10))
    assert cache.get_seq_length(0) == GROW_TOKENS + 10
    assert cache.capacity(0) == 2 * GROW_TOKENS
    keys, values = cache.layer_kv(0)
    assert torch.equal(keys, _tokens(GROW_TOKENS + 10))
    assert torch.equal(values[:, :, :10], -_tokens(10))
    assert cache.get_seq_length(1) == 0 and cache.capacity(1) == GROW_TOKENS  # layers apart


def test_keep_moves_each_heads_positions_to_the_front():
    cache = KvCache(n_layers=2, n_kv_heads=2, head_dim=3, dtype=torch.float32)
    for layer in range(2):
        cache.append(layer, _tokens(6), _tokens(6) + 100)
    indices = torch.tensor([[[0, 2, 5], [1, 3, 4]]])
    cache.keep(0, indices)
    keys, values = cache.layer_kv(0)
    assert cache.get_seq_length(0) == 3 and cache.get_seq_length(1) == 6
    assert keys[0, 0, :, 0].tolist() == [0, 2, 5] and keys[0, 1, :, 0].tolist() == [1, 3, 4]
    assert values[0, 1, :, 0].tolist() == [101, 103, 104]
    # New tokens go after the kept ones.
    cache.append(0, _tokens(1, start=6), _tokens(1, start=6))
    assert cache.layer_kv(0)[0][0, 0, :, 0].tolist() == [0, 2, 5, 6]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match='n_kv_heads'):
        KvCache(n_layers=1, n_kv_heads=0, head_dim=3, dtype=torch.float32)
    cache = KvCache(n_layers=1, n_kv_heads=2, head_dim=3, dtype=torch.float32)
    cache.append(0, _tokens(4), _tokens(4))
    with pytest.raises(ValueError, match='shape'):
        cache.keep(0, torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match='cannot keep'):
        cache.keep(0, torch.tensor([[[0, 4], [1, 2]]]))
