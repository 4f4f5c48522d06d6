"""A preallocated KV cache: per layer one buffer written in place, and a live length.

Shapes: B = batch rows, H = KV heads, C = capacity (tokens), D = head dim. Each layer holds
``keys[l]`` and ``values[l]`` of shape (B, H, C, D) and ``lengths[l]``, the tokens live in
that layer (positions [0, lengths[l]) of the buffer). New tokens are written at the live end;
eviction gathers each head's kept positions to the front and shortens the layer, so layers may
hold different lengths. Keys are stored after RoPE at their true positions, so a shortened
cache needs no re-rotation.

transformers' DynamicCache concatenates (re-copies) the whole cache every step; its
StaticCache attends over the whole reserved length with one mask for all layers, so it cannot
express per-layer eviction (PLATFORM.md). Hence this small cache, written by hand.
Only batch 1 is used by the engine today; the B dimension is there for batched decoding.
"""

import torch

GROW_TOKENS = 256  # capacity grows in steps of this many tokens


def _round_up(n_tokens: int) -> int:
    return -(-n_tokens // GROW_TOKENS) * GROW_TOKENS


class KvCache:
    """Per-layer preallocated key/value buffers with live lengths (tokens)."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device='cpu', capacity: int = GROW_TOKENS, batch: int = 1):
        """Allocate ``n_layers`` buffers of (batch, n_kv_heads, capacity, head_dim)."""
        for name, value in (('n_layers', n_layers), ('n_kv_heads', n_kv_heads),
                            ('head_dim', head_dim), ('capacity', capacity), ('batch', batch)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f'{name} must be an int >= 1, got {value!r}')
        shape = (batch, n_kv_heads, _round_up(capacity), head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.lengths = [0] * n_layers

    @property
    def n_layers(self) -> int:
        """Decoder layers held."""
        return len(self.keys)

    def capacity(self, layer_idx: int = 0) -> int:
        """Tokens layer ``layer_idx`` can hold before it grows."""
        return self.keys[layer_idx].shape[2]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens live in layer ``layer_idx`` (DynamicCache's name for it)."""
        return self.lengths[layer_idx]

    def layer_kv(self, layer_idx: int):
        """Return views of layer ``layer_idx``'s live keys and values, each (B, H, N, D)."""
        n_kv = self.lengths[layer_idx]
        return self.keys[layer_idx][:, :, :n_kv], self.values[layer_idx][:, :, :n_kv]

    def append(self, layer_idx: int, keys: torch.Tensor, values: torch.Tensor):
        """Write ``keys``/``values`` (B, H, n, D) after the live tokens; return layer_kv views.

        The buffer grows (one copy, to a multiple of GROW_TOKENS) when it is full.
        """
        begin = self.lengths[layer_idx]
        end = begin + keys.shape[2]
        self.reserve(layer_idx, end)
        self.keys[layer_idx][:, :, begin:end] = keys
        self.values[layer_idx][:, :, begin:end] = values
        self.lengths[layer_idx] = end
        return self.layer_kv(layer_idx)

    def reserve(self, layer_idx: int, n_tokens: int) -> None:
        """Make layer ``layer_idx`` hold at least ``n_tokens`` (grows by one copy if full)."""
        if n_tokens > self.capacity(layer_idx):
            self._grow(layer_idx, n_tokens)

    def keep(self, layer_idx: int, indices: torch.Tensor) -> None:
        """Keep only positions ``indices`` (B, H, K), ascending, of layer ``layer_idx``.

        The kept entries move to the front of the buffer in their order; the layer's length
        becomes K. Positions past K are left as they are (dead, overwritten later).
        """
        n_kv = self.lengths[layer_idx]
        if indices.dim() != 3 or indices.shape[:2] != self.keys[layer_idx].shape[:2]:
            raise ValueError(f'indices must have shape (B, H, K) matching the cache, got '
                             f'{tuple(indices.shape)}')
        n_keep = indices.shape[2]
        if n_keep > n_kv or (n_keep and int(indices.max()) >= n_kv):
            raise ValueError(f'cannot keep positions {tuple(indices.shape)} of a layer holding '
                             f'{n_kv} tokens')
        for buffer in (self.keys[layer_idx], self.values[layer_idx]):
            index = indices.unsqueeze(-1).expand(-1, -1, -1, buffer.shape[-1])
            # gather reads before the slice is written: the result is a new tensor.
            buffer[:, :, :n_keep] = buffer[:, :, :n_kv].gather(2, index)
        self.lengths[layer_idx] = n_keep

    def _grow(self, layer_idx: int, n_tokens: int) -> None:
        n_kv = self.lengths[layer_idx]
        for buffers in (self.keys, self.values):
            old = buffers[layer_idx]
            new = old.new_zeros((*old.shape[:2], _round_up(n_tokens), old.shape[3]))
            new[:, :, :n_kv] = old[:, :, :n_kv]
            buffers[layer_idx] = new
