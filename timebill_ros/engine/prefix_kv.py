"""Prompt KV between a goal's cache and the prefix store (engine/prefix_store.py).

A prefill copies the stored head of its prompt into the new cache instead of computing it
(:func:`load_prefix`), and afterwards stores the full blocks of its prompt the store lacks
(:func:`keep_prefix`), before any eviction. Shapes: L layers, H KV heads, n tokens, D head dim.
"""

import torch


def load_prefix(forward, ids, prefix, cache, pool, pool_layers) -> int:
    """Copy ``prefix``'s KV into ``cache`` and seed ``pool``; return its tokens (0: none).

    forward: the engine's Forward. ids: the prompt's token ids. prefix: a PrefixMatch of
    them, or None. pool: the prefill's HiddenPool of ``pool_layers``. ValueError when the
    prefix is not a head of ``ids`` or was stored for other pooled layers.
    """
    if prefix is None or not prefix.n_tokens:
        return 0
    size = len(prefix.blocks[0].tokens)
    if (prefix.n_tokens >= len(ids) or prefix.n_tokens != size * len(prefix.blocks)
            or any(block.tokens != tuple(ids[i * size:(i + 1) * size])
                   for i, block in enumerate(prefix.blocks))):
        raise ValueError(f'prefix of {prefix.n_tokens} tokens is not a head of these '
                         f'{len(ids)} prompt tokens')
    pooled = prefix.pool_sum()
    if pooled is None or pooled.shape[0] != len(pool_layers):
        raise ValueError('prefix was stored for other pooled layers')
    with torch.inference_mode():
        for layer_idx in range(forward.n_layers):
            keys = torch.cat([block.kv[layer_idx, 0] for block in prefix.blocks], dim=1)
            values = torch.cat([block.kv[layer_idx, 1] for block in prefix.blocks], dim=1)
            forward.append_kv(cache, layer_idx, keys.unsqueeze(0), values.unsqueeze(0))
    pool.seed(pooled, prefix.n_tokens)
    return prefix.n_tokens


def keep_prefix(forward, store, ids, cache, pool, interrupt=None) -> None:
    """Store the full blocks of ``ids`` the store lacks, from ``cache`` and ``pool``.

    ``interrupt`` is checked before each block's copy (a block of a long prompt's KV is
    megabytes; the whole prompt's, ~90 MB for 2.4k tokens of Gemma 3 270M, took ~20 ms
    past a deadline): when it fires, the blocks copied so far stay stored and the rest are
    not, and the goal stops at its next check.
    """
    size = store.block_tokens

    def make_block(index):
        if interrupt is not None and interrupt.check(0, None, len(ids)) is not None:
            return None
        pooled = pool.block_sum(index)
        if pooled is None:  # a copied head block the store dropped meanwhile
            return None
        return block_kv(forward, cache, index * size, (index + 1) * size), pooled

    store.insert(ids, make_block)


def block_kv(forward, cache, begin: int, end: int) -> torch.Tensor:
    """Return a copy of positions [begin, end) of every layer's KV, (L, 2, H, n, D)."""
    with torch.inference_mode():
        parts = []
        for layer in range(forward.n_layers):
            keys, values = forward.layer_kv(cache, layer)
            parts += [keys[0, :, begin:end], values[0, :, begin:end]]
        # One stack, not 2 L copies: on a GPU each copy is a kernel launch (a 3k-token
        # prompt's 47 blocks of SmolLM2 were ~2.9k launches).
        stacked = torch.stack(parts)  # (2 L, H, n, D)
        return stacked.view(forward.n_layers, 2, *stacked.shape[1:])
