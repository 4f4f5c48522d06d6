"""Decoding steps of the dense GGUF decoder on static buffers, replayed as CUDA graphs.

On a GPU one decoding step of a small model is ~500 small kernels; launched one by one from
Python each costs more CPU time than the GPU spends on it (11-18 ms a token on an H100 and an
H200 where the weights' bandwidth floor is ~0.2 ms, docs/gpu.md). A CUDA graph records the
step's kernels once and replays them with one launch, which needs every tensor the step
reads or writes at a fixed address and of a fixed shape:

- a :class:`_Bucket` per (rows B, KV capacity C) holds the KV buffers of B goals, each layer
  (B, H_kv, C, D), and the step's inputs (token ids, positions, each layer's live length) in
  one device tensor written before each replay; C is a power of two >= ``MIN_CAPACITY``;
- a goal's :class:`~timebill_ros.engine.kv_cache.KvCache` *lives in* a row of a bucket: its
  per-layer buffers become views of that row, so eviction, the prefix store and the engine's
  ``layer_kv`` read and write the bucket itself. A cache is copied into a row once, when it
  joins (after its prefill and eviction) or grows past its bucket's capacity; a cache a row
  is taken from gets its own copy first, so no goal's KV is ever overwritten;
- attention runs over the whole capacity with an additive mask per layer (live length and
  sliding window), so one graph serves every length below C.

The step's arithmetic is the dense decoder's own (RMSNorm, RoPE's rotate-half, GQA, the
family's norms and activation), written for B one-token rows; on the CPU it runs eagerly
(tests check it against the decoder's own steps), on CUDA it is captured on first use of a
bucket and replayed after. Stops (cancel, Kill) are checked between steps, each check
waiting for the GPU first (PassHooks.wait): a graph runs a step's layers without a break.

Shapes: B = rows of a step, L = layers, H_q / H_kv = query / KV heads, G = H_q / H_kv,
C = capacity (tokens), D = head dim, V = vocabulary.
"""

import weakref

import torch
import torch.nn.functional as F

from timebill_ros.engine.forward import pool_steps, rows_alive

MIN_CAPACITY = 256  # the smallest bucket, tokens
# Buckets' KV buffers kept at most (bytes, all buckets): the least recently used bucket is
# given back (its rows' caches copied out first) when a new one would pass it. The engine
# sets it from engine.step_buffers_mb (this is its default).
DEFAULT_MAX_BYTES = 2048 * 10 ** 6
WARM_TOKENS = 4096  # StaticSteps.warm: one-row graphs captured at load up to this capacity
SPLIT_TOKENS = 128  # weighted_values: KV slots a part of the attention's value sum


def capacity_for(n_tokens: int) -> int:
    """Return the bucket capacity (a power of two >= MIN_CAPACITY) holding ``n_tokens``."""
    capacity = MIN_CAPACITY
    while capacity < n_tokens:
        capacity *= 2
    return capacity


class _Bucket:
    """Static fp32 buffers of B rows at capacity C, and the step's graph once captured."""

    def __init__(self, decoder, n_rows: int, capacity: int):
        """Allocate the KV buffers and inputs of ``n_rows`` rows of ``capacity`` tokens."""
        spec, device = decoder.spec, decoder.device
        self.n_rows, self.capacity = n_rows, capacity
        shape = (n_rows, spec.n_kv_heads, capacity, spec.head_dim)
        self.keys = [torch.zeros(shape, dtype=torch.float32, device=device)
                     for _ in range(spec.n_layers)]
        self.values = [torch.zeros(shape, dtype=torch.float32, device=device)
                       for _ in range(spec.n_layers)]
        # What a cache's per-layer lists hold while it lives in row r (views of the buffers).
        self.key_rows = [[k[r:r + 1] for k in self.keys] for r in range(n_rows)]
        self.value_rows = [[v[r:r + 1] for v in self.values] for r in range(n_rows)]
        self.owners = [None] * n_rows  # weakref to the KvCache living in each row
        # token ids (B), positions (B), live lengths before the step (L x B), int64
        self.inputs = torch.zeros(n_rows * (2 + spec.n_layers), dtype=torch.long, device=device)
        self.rows = torch.arange(n_rows, device=device)
        self.slots = torch.arange(capacity, device=device)
        # rotate_half(x) = roll(x, D / 2) * signs: -1 on the first half, +1 on the second.
        half = spec.head_dim // 2
        self.signs = torch.cat((-torch.ones(half), torch.ones(spec.head_dim - half))).to(device)
        # Tokens each layer sees: its sliding window, or more than the capacity.
        self.windows = torch.tensor(
            [spec.sliding_window if spec.is_sliding(i) else capacity + 1
             for i in range(spec.n_layers)], dtype=torch.long, device=device).view(-1, 1, 1)
        self.logits = None  # (B, V) fp32: the step's output (static once captured)
        self.hidden = None  # (B, hidden): the last layer's output before the final norm
        self.graph = None
        self.nbytes = 2 * sum(k.numel() * k.element_size() for k in self.keys)

    def holds(self, row: int, cache) -> bool:
        """Return whether ``cache`` lives in row ``row`` (its buffers are the row's views)."""
        return (all(a is b for a, b in zip(cache.keys, self.key_rows[row]))
                and all(a is b for a, b in zip(cache.values, self.value_rows[row])))

    def vacate(self, row: int) -> None:
        """Give row ``row``'s cache (if it still lives there) its own copy of its buffers."""
        owner = self.owners[row]() if self.owners[row] is not None else None
        if owner is not None and self.holds(row, owner):
            owner.keys = [k.clone() for k in owner.keys]
            owner.values = [v.clone() for v in owner.values]
        self.owners[row] = None

    def seat(self, row: int, cache) -> None:
        """Copy ``cache``'s live KV into row ``row`` and make it live there."""
        for layer, n_kv in enumerate(cache.lengths):
            self.key_rows[row][layer][:, :, :n_kv].copy_(cache.keys[layer][:, :, :n_kv])
            self.value_rows[row][layer][:, :, :n_kv].copy_(cache.values[layer][:, :, :n_kv])
        cache.keys = list(self.key_rows[row])
        cache.values = list(self.value_rows[row])
        self.owners[row] = weakref.ref(cache)


class StaticSteps:
    """One-token decoding steps of a dense GgufDecoder on buckets; see the module docstring.

    graphs: capture and replay CUDA graphs (default on a CUDA device); False runs the same
    static step eagerly (the CPU; a comparison on the GPU). Not thread-safe: one caller at a
    time (the engine's), a twin decoder has its own.
    """

    def __init__(self, decoder, max_bytes: int = DEFAULT_MAX_BYTES):
        """Serve ``decoder`` (a dense GgufDecoder); keep at most ``max_bytes`` of buckets."""
        self.decoder = decoder
        self.graphs = decoder.device.type == 'cuda'
        self.max_bytes = int(max_bytes)
        self._buckets = {}  # (B, C) -> _Bucket, least recently used first
        self.n_captures = 0  # graphs captured so far
        self.n_seats = 0  # caches copied into a bucket row so far

    @property
    def held_bytes(self) -> int:
        """Bytes of KV buffers the buckets hold."""
        return sum(bucket.nbytes for bucket in self._buckets.values())

    def run(self, token_ids: list, positions: list, caches: list, hooks: list):
        """Run one decoding step of B rows (see ``Forward.run_step``).

        Each row's interrupt is checked once, before the step (a row it stops leaves the
        step). Returns ``(logits, interrupted)``: row -> (V,) fp32 logits (views of the
        bucket's output: read them before the next step), row -> stop reason.
        """
        interrupted = {}
        alive = rows_alive(list(range(len(token_ids))), hooks, interrupted)
        if not alive:
            return {}, interrupted
        rows = [caches[i] for i in alive]
        need = max(max(cache.lengths) for cache in rows) + 1
        bucket = self._bucket(len(rows), capacity_for(need))
        self._seat_all(bucket, rows)
        values = ([token_ids[i] for i in alive] + [positions[i] for i in alive]
                  + [cache.lengths[layer] for layer in range(self.decoder.n_layers)
                     for cache in rows])
        bucket.inputs.copy_(torch.tensor(values, dtype=torch.long))
        if not self.graphs:
            bucket.logits, bucket.hidden = self.step(bucket)
        else:
            if bucket.graph is None:
                self._capture(bucket)
            bucket.graph.replay()
        for cache in rows:
            cache.lengths = [n_kv + 1 for n_kv in cache.lengths]
        pool_steps(hooks, alive, bucket.hidden, self.decoder.n_layers)
        return {row: bucket.logits[i] for i, row in enumerate(alive)}, interrupted

    def warm(self, n_rows: int = 1, max_tokens: int = WARM_TOKENS) -> int:
        """Capture the graphs of ``n_rows`` rows for every capacity up to ``max_tokens``.

        What a first goal at a new capacity would otherwise pay inside its first step (two
        warm-up runs and the capture: tens of ms): the start-up calibration and goals then
        time replays. Capped at the model's context. Returns the graphs captured (0 without
        graphs). The buckets' inputs are zeros: the runs write slot 0 of row 0, which no
        cache lives in yet.
        """
        if not self.graphs:
            return 0
        captured, capacity = 0, MIN_CAPACITY
        limit = min(max_tokens, capacity_for(self.decoder.context_tokens))
        with torch.inference_mode():
            while capacity <= limit:
                bucket = self._bucket(n_rows, capacity)
                if bucket.graph is None and not any(bucket.owners):
                    self._capture(bucket)
                    captured += 1
                capacity *= 2
        return captured

    def _bucket(self, n_rows: int, capacity: int) -> _Bucket:
        """Return the bucket of (n_rows, capacity), made (and older ones dropped) if needed."""
        key = (n_rows, capacity)
        bucket = self._buckets.pop(key, None)
        if bucket is None:
            bucket = _Bucket(self.decoder, n_rows, capacity)
            while self._buckets and self.held_bytes + bucket.nbytes > self.max_bytes:
                self._drop(next(iter(self._buckets)))
        self._buckets[key] = bucket  # most recently used last
        return bucket

    def _drop(self, key) -> None:
        """Give bucket ``key`` back; the caches living in it keep copies of their KV."""
        bucket = self._buckets.pop(key)
        for row in range(bucket.n_rows):
            bucket.vacate(row)

    def _seat_all(self, bucket: _Bucket, caches: list) -> None:
        """Make ``caches[r]`` live in row r of ``bucket`` (copies only where it does not)."""
        moving = [r for r, cache in enumerate(caches) if not bucket.holds(r, cache)]
        for row in moving:  # first every row taken from another cache gives it a copy
            bucket.vacate(row)
        for row in moving:
            bucket.seat(row, caches[row])
            self.n_seats += 1

    def _capture(self, bucket: _Bucket) -> None:
        """Record ``bucket``'s step as a CUDA graph (after two warm-up runs on a side stream).

        The warm-up runs write the same keys and values at the same slots as the step that
        follows (its inputs are already in place), so running them changes nothing.
        """
        stream = torch.cuda.Stream(device=self.decoder.device)
        stream.wait_stream(torch.cuda.current_stream(self.decoder.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.step(bucket)
        torch.cuda.current_stream(self.decoder.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA calls of other threads (the predictor's, a ROS callback's) do not
        # invalidate the capture.
        with torch.cuda.graph(graph, capture_error_mode='thread_local'):
            bucket.logits, bucket.hidden = self.step(bucket)
        bucket.graph = graph
        self.n_captures += 1

    # -- the step itself (only tensor ops on the bucket's tensors: capturable) ---------------

    def step(self, bucket: _Bucket) -> tuple:
        """Return the logits (B, V) fp32 of one step of ``bucket``'s inputs; write its KV.

        And the last layer's output before the final norm, (B, hidden) (the answer pool's).
        """
        decoder, spec = self.decoder, self.decoder.spec
        n_rows, n_layers = bucket.n_rows, spec.n_layers
        tokens = bucket.inputs[:n_rows]
        positions = bucket.inputs[n_rows:2 * n_rows]
        lengths = bucket.inputs[2 * n_rows:].view(n_layers, n_rows)
        x = decoder.embed.weight[tokens].float()  # (B, hidden)
        if spec.embed_scale != 1.0:
            x = x * spec.embed_scale
        ropes = {}  # base -> (cos, sin with rotate-half's signs), each (B, 1, D)
        for base, (cos, sin) in decoder.rope.at(positions).items():
            ropes[base] = cos.unsqueeze(1), (sin * bucket.signs).unsqueeze(1)
        masks = self._masks(bucket, lengths)
        for layer_idx, layer in enumerate(decoder.layers):
            x = self._layer(bucket, layer_idx, layer, x, ropes[decoder.rope.base_of(layer_idx)],
                            lengths[layer_idx], masks[layer_idx])
        hidden = x
        x = F.rms_norm(x, decoder.final_norm.shape, decoder.final_norm, spec.norm_eps)
        return decoder.lm_head.product(x).float(), hidden

    def _masks(self, bucket: _Bucket, lengths: torch.Tensor) -> torch.Tensor:
        """Return each layer's additive attention mask, (L, B x H_kv, 1, C).

        Slot s of a row is seen when it holds a live token after the step's write
        (s < n_kv + 1) inside the layer's sliding window (s >= n_kv + 1 - window).
        """
        spec = self.decoder.spec
        live = (lengths + 1).unsqueeze(-1)  # (L, B, 1)
        slots = bucket.slots.view(1, 1, -1)
        seen = (slots < live) & (slots >= live - bucket.windows)  # (L, B, C)
        mask = torch.zeros(seen.shape, dtype=torch.float32, device=seen.device)
        mask = mask.masked_fill(~seen, float('-inf'))
        mask = mask.unsqueeze(2).expand(-1, -1, spec.n_kv_heads, -1)
        return mask.reshape(spec.n_layers, bucket.n_rows * spec.n_kv_heads, 1,
                            bucket.capacity)

    def _layer(self, bucket, layer_idx, layer, x, rope, n_kv, mask):
        """One decoder layer of B one-token rows; x: (B, hidden) fp32 -> (B, hidden).

        The dense decoder's arithmetic in fewer kernels (a graph replays each one): RoPE on
        queries and keys at once, rotate-half as a roll with signed sines, the residual adds
        taking the 16-bit GEMM outputs as they are (type promotion: fp32 sums).
        rope: (cos, signed sin), each (B, 1, D); n_kv: (B,) live tokens before the step;
        mask: (B x H_kv, 1, C).
        """
        spec, eps = self.decoder.spec, self.decoder.spec.norm_eps
        n_rows, head_dim = x.shape[0], spec.head_dim
        n_q, n_kv_rows = spec.n_heads * head_dim, spec.n_kv_heads * head_dim
        h = F.rms_norm(x, layer.attn_norm.shape, layer.attn_norm, eps)
        qkv = _single(layer.qkv).product(h).float()  # (B, n_q + 2 n_kv_rows)
        v = qkv[:, n_q + n_kv_rows:].view(n_rows, spec.n_kv_heads, head_dim)
        if layer.q_norm is not None:
            q = F.rms_norm(qkv[:, :n_q].view(n_rows, spec.n_heads, head_dim),
                           layer.q_norm.shape, layer.q_norm, eps)
            k = F.rms_norm(qkv[:, n_q:n_q + n_kv_rows].view(n_rows, spec.n_kv_heads, head_dim),
                           layer.k_norm.shape, layer.k_norm, eps)
            qk = torch.cat((q, k), dim=1)
        else:
            qk = qkv[:, :n_q + n_kv_rows].view(n_rows, spec.n_heads + spec.n_kv_heads,
                                               head_dim)
        cos, signed_sin = rope
        qk = torch.addcmul(qk * cos, qk.roll(head_dim // 2, dims=-1), signed_sin)
        q, k = qk[:, :spec.n_heads], qk[:, spec.n_heads:]
        keys, values = bucket.keys[layer_idx], bucket.values[layer_idx]
        keys[bucket.rows, :, n_kv] = k
        values[bucket.rows, :, n_kv] = v
        flat = n_rows * spec.n_kv_heads
        group = spec.n_heads // spec.n_kv_heads
        scores = torch.baddbmm(mask, q.reshape(flat, group, head_dim),
                               keys.view(flat, bucket.capacity, head_dim).transpose(1, 2),
                               alpha=spec.attention_scale)  # (B x H_kv, G, C)
        probs = torch.softmax(scores, dim=-1)
        attn = weighted_values(probs, values.view(flat, bucket.capacity, head_dim))
        out = _single(layer.out).product(attn.view(n_rows, n_q))
        if layer.post_attn_norm is not None:
            out = F.rms_norm(out.float(), layer.post_attn_norm.shape, layer.post_attn_norm, eps)
        x = x + out
        h = F.rms_norm(x, layer.ffn_norm.shape, layer.ffn_norm, eps)
        # The gated activation in the GEMMs' dtype: its inputs are their outputs and its
        # output their input (one rounding more than the eager path's fp32 product).
        gate, up = _single(layer.gate_up).product(h).chunk(2, dim=-1)
        if spec.activation == 'silu':
            act = F.silu(gate) * up
        else:
            act = F.gelu(gate, approximate='tanh') * up
        out = _single(layer.down).product(act)
        if layer.post_ffn_norm is not None:
            out = F.rms_norm(out.float(), layer.post_ffn_norm.shape, layer.post_ffn_norm, eps)
        return x + out


def weighted_values(probs: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Return probs (N, G, C) @ values (N, C, D), (N, G, D), the sum over C split in parts.

    A batch of N one-row products (N = B x H_kv: 3 for one goal of SmolLM2) runs as a few
    thread blocks each summing all C slots (measured on an H200, 2026-11-28: SmolLM2's step
    took 2.5 / 4.2 / 6.0 ms at 256 / 1024 / 4096 capacity, where Gemma's, one KV head of
    256 values, stayed at ~1.9). Split into C / ``SPLIT_TOKENS`` parts the products run as
    N x parts blocks, then one sum adds the parts.
    """
    n_rows, group, capacity = probs.shape
    if capacity <= SPLIT_TOKENS or capacity % SPLIT_TOKENS:
        return torch.bmm(probs, values)
    parts = capacity // SPLIT_TOKENS
    split = probs.view(n_rows, group, parts, SPLIT_TOKENS).transpose(1, 2)  # (N, S, G, c)
    return torch.matmul(split, values.view(n_rows, parts, SPLIT_TOKENS, -1)).sum(dim=1)


def _single(linears):
    """Return the one dense matrix of ``linears`` (the dense path joins every part)."""
    if len(linears.groups) != 1:
        raise ValueError(f'a dense layer holds one matrix per projection, got '
                         f'{len(linears.groups)}')
    return linears.groups[0][0]
