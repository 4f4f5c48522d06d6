"""The transformers forward pass: any causal LM, a DynamicCache, module hooks.

kvpress compresses the cache *during* the prefill with a ratio fixed beforehand, but TimeBill
chooses the eviction ratio after the prefill, so the prefill evicts nothing: forward pre-hooks
on every attention module hand its input and RoPE ``position_embeddings`` to
:class:`PassHooks`, and pre-hooks on every decoder layer check its interrupts. Decoding feeds
the true positions (``position_ids`` = N_x, N_x + 1, ...) although an evicted cache is
shorter, so RoPE stays right; ``cache_position`` is left to transformers (the index in the
shortened cache).
"""

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from timebill_ros.engine.forward import Forward, PassHooks
from timebill_ros.engine.eviction import gather_positions


class TransformersForward(Forward):
    """``model(...)`` over a DynamicCache, for every model transformers loads."""

    name = 'transformers'

    def __init__(self, model):
        """Run ``model`` (a transformers causal LM with ``model.model.layers``)."""
        self.model = model

    def new_cache(self) -> DynamicCache:
        """Return an empty DynamicCache."""
        return DynamicCache(config=self.model.config)

    def hooked(self, hooks: PassHooks):
        """Context manager registering module hooks that call ``hooks``."""
        return _Hooks(self.model.model.layers, hooks)

    def run(self, token_ids: list, position: int, cache, step: bool) -> torch.Tensor:
        """Run the tokens at positions ``position``...; return the last logits, (vocab,)."""
        device = self.model.device
        ids = torch.tensor([token_ids], dtype=torch.long, device=device)
        positions = torch.arange(position, position + len(token_ids), device=device)
        out = self.model(input_ids=ids, position_ids=positions.unsqueeze(0),
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1]

    def layer_kv(self, cache, layer_idx: int):
        """Return layer ``layer_idx``'s keys and values, each (1, H, N, D)."""
        layer = _full_layer(cache, layer_idx)
        return layer.keys, layer.values

    def append_kv(self, cache, layer_idx: int, keys: torch.Tensor,
                  values: torch.Tensor) -> None:
        """Write ``keys`` / ``values`` (1, H, n, D) after layer ``layer_idx``'s tokens."""
        cache.update(keys, values, layer_idx)

    def keep(self, cache, layer_idx: int, indices: torch.Tensor) -> None:
        """Keep positions ``indices`` (1, H, K) of layer ``layer_idx``."""
        layer = _full_layer(cache, layer_idx)
        # DynamicLayer (transformers 5.2) holds plain (B, H, N, D) tensors and concatenates
        # new tokens to them; its length is keys.shape[-2], so replacing them is enough.
        layer.keys = gather_positions(layer.keys, indices)
        layer.values = gather_positions(layer.values, indices)


def _full_layer(cache, layer_idx):
    layer = cache.layers[layer_idx]
    if type(layer) is not DynamicLayer:
        raise TypeError(f'KV eviction needs a full DynamicLayer cache, got {type(layer)}')
    return layer


class _Hooks:
    """Context manager: pre-hooks on decoder layers (interrupts) and attention (capture)."""

    def __init__(self, layers, hooks: PassHooks):
        self.layers, self.hooks = layers, hooks
        self._handles = []

    def __enter__(self):
        hooks = self.hooks
        if hooks.pool is not None:
            for number in hooks.pool.layers:
                self._handles.append(self.layers[number - 1].register_forward_hook(
                    self._pooler(number, hooks.pool)))
        if hooks.answer_pool is not None:  # decoding steps: the last layer's outputs
            self._handles.append(self.layers[-1].register_forward_hook(
                self._pooler(len(self.layers), hooks.answer_pool)))
        for idx, layer in enumerate(self.layers):
            if hooks.checks_layers:
                self._handles.append(layer.register_forward_pre_hook(
                    lambda module, args: hooks.before_layer()))
            if hooks.captures:
                self._handles.append(layer.self_attn.register_forward_pre_hook(
                    self._capture, with_kwargs=True))
        return hooks

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @staticmethod
    def _pooler(number, target):
        """Return a forward hook adding layer ``number``'s output to ``target`` (a pool)."""
        def pool(module, args, output):
            target.add(number, output[0] if isinstance(output, tuple) else output)
        return pool

    def _capture(self, module, args, kwargs):
        hidden = kwargs['hidden_states'] if 'hidden_states' in kwargs else args[0]
        cos, sin = kwargs['position_embeddings']
        self.hooks.keep_inputs(module.layer_idx, module, hidden, cos, sin)
