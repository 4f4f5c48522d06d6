"""A lean forward pass for Llama-family models (Llama, SmolLM2, TinyLlama, Qwen2) on KvCache.

Why by hand: transformers' modules re-copy a DynamicCache every step and cannot attend over a
per-layer preallocated cache; a plain loop over the layers' own weights can, costs less Python
per step, and lets each one-token step use 16-bit weight copies (on this CPU fp16 weights run
the one-token matmuls ~2x faster than MKL's fp32; PLATFORM.md). The weights are the loaded
transformers model's own tensors (no copy for fp32); the prefill always runs in the model's
dtype. The maths follows transformers' LlamaDecoderLayer with sdpa attention, op for op, so
fp32 output matches the transformers path (test_lean_llama.py).

Shapes: n = tokens in the pass, H_q / H_kv = query / KV heads, D = head dim.
"""

import warnings
from typing import Optional

import torch
import torch.nn.functional as F

from timebill_ros.engine import kernels
from timebill_ros.engine.forward import KvCacheForward, PassHooks, pool_steps, rows_alive
from timebill_ros.engine.kv_cache import KvCache

MODEL_TYPES = ('llama', 'qwen2')
# torch 2.13 (pinned) warns that the two FBGEMM fp16 functions used below are deprecated, once
# per process, into every server log; the aten fallback takes over if they go away.
warnings.filterwarnings('ignore', message=r'fbgemm_\w+ is deprecated', category=UserWarning)


def unsupported_reason(model) -> Optional[str]:
    """Return why ``model`` cannot run on the lean forward, or None when it can."""
    config = model.config
    if config.model_type not in MODEL_TYPES:
        return f'model_type {config.model_type!r} is not one of {MODEL_TYPES}'
    if getattr(config, 'hidden_act', 'silu') != 'silu':
        return f'hidden_act {config.hidden_act!r} is not silu'
    if getattr(config, 'use_sliding_window', False):
        return 'sliding-window attention'
    if getattr(config, 'pretraining_tp', 1) not in (None, 1):
        return f'pretraining_tp {config.pretraining_tp}'
    return None


def fbgemm_fp16_available() -> bool:
    """Return True when torch has FBGEMM's fp16-weight GEMM (x86 CPU builds; not on ARM).

    torch 2.13 marks these two functions deprecated (a one-time warning); torch is pinned,
    and without them the aten fp16 path runs.
    """
    return ('fbgemm' in torch.backends.quantized.supported_engines
            and hasattr(torch, 'fbgemm_pack_gemm_matrix_fp16')
            and hasattr(torch, 'fbgemm_linear_fp16_weight'))


class _Linear:
    """y = x W^T + b over the weights of one or more nn.Linear (their outputs concatenated).

    The model-dtype path uses the modules' own tensors (a single module: no copy). With
    ``step_dtype`` set, one-token steps use one concatenated copy in that dtype. fp16 on a CPU
    with FBGEMM uses its fp16-weight GEMM (fp32 activations in and out): on this machine it
    streams a model's weights as fast as aten's fp16 linear at one row and 2.6x faster at
    eight (aten's fp16 GEMM is not vectorised for several rows), and it needs no activation
    casts. Elsewhere (CUDA, ARM) aten's linear in ``step_dtype``.
    """

    def __init__(self, modules, step_dtype: Optional[torch.dtype], blocks=None):
        """Wrap ``modules`` (nn.Linear, same input size); copy weights to ``step_dtype``.

        blocks: one ``(GGML type, blocks (N, row bytes) uint8)`` per module (the GGUF's own
        weights, engine/gguf_weights.py), or None. When given for every module in one type,
        they are kept joined in the kernels' layout (``gguf_blocks``), one-token steps run the
        GGUF kernels on them and ``step_dtype`` is not used.
        """
        self.parts = [(m.weight, m.bias) for m in modules]
        self.split = [w.shape[0] for w, _ in self.parts]
        self.step_weight = self.step_bias = self.packed = None
        self.int8_weight = self.int8_scale = None
        self.gguf_blocks = self.gguf_type = self.kernels = None
        self.step_bytes = sum(w.numel() * w.element_size() for w, _ in self.parts)
        if blocks is not None and self._use_blocks(blocks):
            return
        if step_dtype is None:
            return
        with torch.no_grad():
            weight = torch.cat([w for w, _ in self.parts])
            bias = self._joined_bias()
            if step_dtype == torch.int8:
                self._quantize_int8(weight, bias)
                return
            self.step_bytes = weight.numel() * torch.finfo(step_dtype).bits // 8
            if (step_dtype == torch.float16 and weight.device.type == 'cpu'
                    and weight.dtype == torch.float32 and fbgemm_fp16_available()):
                self.packed = torch.fbgemm_pack_gemm_matrix_fp16(weight)
                self.step_bias = bias if bias is not None else weight.new_zeros(weight.shape[0])
            else:
                self.step_weight = weight.to(step_dtype)
                self.step_bias = None if bias is None else bias.to(step_dtype)

    def _joined_bias(self):
        """Return the modules' biases concatenated (zeros for a module without), or None."""
        if all(b is None for _, b in self.parts):
            return None
        return torch.cat([b if b is not None else w.new_zeros(w.shape[0])
                          for w, b in self.parts])

    def _use_blocks(self, blocks) -> bool:
        """Keep the GGUF blocks of the modules (one type, rows concatenated); False if not."""
        if (len(blocks) != len(self.parts) or any(b is None for b in blocks)
                or len({qtype for qtype, _ in blocks}) != 1):
            return False
        self.gguf_type = blocks[0][0]
        rows = torch.cat([data for _, data in blocks]).contiguous()
        if rows.shape[0] != sum(self.split):
            raise ValueError(f'GGUF blocks hold {rows.shape[0]} rows, the layers '
                             f'{sum(self.split)}')
        bias = self._joined_bias()
        self.step_bias = None if bias is None else bias.detach().float()
        self.kernels = kernels.load()
        # The kernels' own layout (rows in interleaved groups, gguf_gemm.cpp pack).
        self.gguf_blocks = self.kernels.pack(rows, self.gguf_type, self.parts[0][0].shape[1])
        self.step_bytes = rows.numel()
        return True

    def _quantize_int8(self, weight: torch.Tensor, bias) -> None:
        """Keep ``weight`` (N, K) as int8 with one bf16 scale per output row (absmax / 127).

        Weight-only: activations go in as bf16, the kernel (torch._weight_int8pack_mm, which
        AVX-512 CPUs vectorise for bf16 activations only) accumulates in fp32; the bias is
        added in fp32 afterwards.
        """
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        self.int8_weight = (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
        self.int8_scale = scale.to(torch.bfloat16)
        self.step_bias = bias
        self.step_bytes = weight.numel() + 2 * weight.shape[0]

    @property
    def kernel(self) -> str:
        """Name what one-token steps run.

        ``gguf-<type id>``, ``fbgemm-fp16``, ``int8-bf16``, ``aten-<dtype>`` or ``model``
        (the model's own).
        """
        if self.gguf_blocks is not None:
            return f'gguf-{self.gguf_type}'
        if self.int8_weight is not None:
            return 'int8-bf16'
        if self.packed is not None:
            return 'fbgemm-fp16'
        if self.step_weight is not None:
            return f'aten-{str(self.step_weight.dtype).replace("torch.", "")}'
        return 'model'

    def __call__(self, x: torch.Tensor, step: bool):
        """Return the outputs, one tensor per module, in ``x``'s dtype."""
        if step and self.gguf_blocks is not None:
            y = self._gguf(x)
        elif step and self.int8_weight is not None:
            rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
            y = torch._weight_int8pack_mm(rows, self.int8_weight, self.int8_scale)
            y = y.to(x.dtype).view(*x.shape[:-1], -1)
            if self.step_bias is not None:
                y = y + self.step_bias
        elif step and self.packed is not None:
            y = torch.fbgemm_linear_fp16_weight(x, self.packed, self.step_bias)
        elif step and self.step_weight is not None:
            y = F.linear(x.to(self.step_weight.dtype), self.step_weight, self.step_bias)
            y = y.to(x.dtype)
        else:
            return tuple(F.linear(x, w, b) for w, b in self.parts)
        return (y,) if len(self.split) == 1 else y.split(self.split, dim=-1)

    def _gguf(self, x: torch.Tensor) -> torch.Tensor:
        """Return x W^T from the GGUF blocks; x (..., K) -> (..., N), rows 8 at a time."""
        rows = x.reshape(-1, x.shape[-1]).to(torch.float32).contiguous()
        parts = [self.kernels.gemm(rows[i:i + kernels.MAX_ROWS], self.gguf_blocks, self.gguf_type,
                                   sum(self.split), False)
                 for i in range(0, rows.shape[0], kernels.MAX_ROWS)]
        y = parts[0] if len(parts) == 1 else torch.cat(parts)
        if self.step_bias is not None:
            y = y + self.step_bias
        return y.to(x.dtype).view(*x.shape[:-1], -1)


def _rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """Return LlamaRMSNorm(x) as transformers computes it: normalise in fp32, scale."""
    dtype = x.dtype
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x32.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _Layer:
    """One decoder layer's weights and shapes."""

    def __init__(self, layer, step_dtype, blocks=None, prefix=''):
        """Take ``layer``'s (a transformers decoder layer) weights.

        blocks / prefix: the GGUF step blocks by module name (``<prefix>self_attn.q_proj``...)
        or None.
        """
        self.attn = attn = layer.self_attn
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm

        def linear(*names):
            modules = [layer.get_submodule(name) for name in names]
            found = None if blocks is None else [blocks.get(prefix + name) for name in names]
            return _Linear(modules, step_dtype, found)

        self.qkv = linear('self_attn.q_proj', 'self_attn.k_proj', 'self_attn.v_proj')
        self.out = linear('self_attn.o_proj')
        self.gate_up = linear('mlp.gate_proj', 'mlp.up_proj')
        self.down = linear('mlp.down_proj')
        linears = (self.qkv, self.out, self.gate_up, self.down)
        # A one-token step runs as one C++ call when every linear is on GGUF blocks (fp32,
        # no biases): engine/kernels layer_step.
        self.fused = (all(lin.gguf_blocks is not None and lin.step_bias is None
                          for lin in linears)
                      and all(w.dtype == torch.float32 and w.device.type == 'cpu'
                              for lin in linears for w, _ in lin.parts))
        self.head_dim = attn.head_dim
        self.n_heads = attn.config.num_attention_heads
        self.scaling = attn.scaling


class LeanLlamaForward(KvCacheForward):
    """Llama-family forward over a :class:`KvCache`; see the module docstring."""

    name = 'lean'

    def __init__(self, model, step_dtype: Optional[torch.dtype] = None, step_blocks=None):
        """Use ``model``'s weights; one-token steps in ``step_dtype`` (None: model dtype).

        step_blocks: {module name: (GGML type, blocks)} (engine/gguf_weights.py): one-token
        steps multiply by the GGUF's own blocks where given (``decode_weights: gguf``).
        """
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f'the lean forward cannot run this model: {reason}')
        if step_dtype == model.dtype:
            step_dtype = None
        config, base = model.config, model.model
        self.model = model
        self.step_dtype = step_dtype
        self.embed = base.embed_tokens
        self.layers = [_Layer(layer, step_dtype, step_blocks, f'model.layers.{i}.')
                       for i, layer in enumerate(base.layers)]
        self.final_norm = base.norm
        head = None if step_blocks is None else [step_blocks.get('lm_head')]
        self.lm_head = _Linear([model.lm_head], step_dtype, head)
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = self.layers[0].head_dim
        self._hooks = PassHooks()
        with torch.inference_mode():
            positions = torch.arange(config.max_position_embeddings, device=model.device)
            probe = self.embed.weight[:1].unsqueeze(0)
            cos, sin = base.rotary_emb(probe, positions.unsqueeze(0))
        # RoPE tables of every position, (positions, D): rows are what rotary_emb returns.
        self.cos, self.sin = cos[0], sin[0]
        # rotate_half(x) == x @ rotate, (D, D): out[j] = -x[j + D/2], out[j + D/2] = x[j].
        half = self.head_dim // 2
        self.rotate = torch.zeros(self.head_dim, self.head_dim, dtype=self.cos.dtype,
                                  device=model.device)
        self.rotate[torch.arange(half) + half, torch.arange(half)] = -1.0
        self.rotate[torch.arange(half), torch.arange(half) + half] = 1.0

    def new_cache(self) -> KvCache:
        """Return an empty cache in the model's dtype and device."""
        return KvCache(len(self.layers), self.n_kv_heads, self.head_dim, self.model.dtype,
                       self.model.device)

    def run(self, token_ids: list, position: int, cache: KvCache, step: bool) -> torch.Tensor:
        """Run the tokens at positions ``position``...; return the last logits, (vocab,)."""
        device = self.model.device
        ids = torch.tensor([token_ids], dtype=torch.long, device=device)
        n_tokens = len(token_ids)
        cos = self.cos[position:position + n_tokens].unsqueeze(0)
        sin = self.sin[position:position + n_tokens].unsqueeze(0)
        x = self.embed(ids)
        hooks = self._hooks
        for layer_idx, layer in enumerate(self.layers):
            hooks.before_layer()
            x = self._layer(layer_idx, layer, x, cos, sin, cache, step)
            if hooks.pool is not None and not step:
                hooks.pool.add(layer_idx + 1, x)
        last = _rms_norm(x[:, -1:], self.final_norm)
        return self.lm_head(last, step)[0][0, -1]

    max_batch = 64

    def run_step(self, token_ids: list, positions: list, caches: list, hooks: list):
        """Run one decoding step of B goals together (see :meth:`Forward.run_step`).

        The linear layers run on all B rows at once (their weights are read once per step,
        which is what batching buys on a memory-bound CPU); attention runs per row over that
        row's own cache and live length. A row whose interrupt fires leaves the step before
        that layer.
        """
        device = self.model.device
        rows = list(range(len(token_ids)))
        x = self.embed(torch.tensor(token_ids, dtype=torch.long, device=device)).unsqueeze(1)
        index = torch.tensor(positions, dtype=torch.long, device=device)
        cos, sin = self.cos[index].unsqueeze(1), self.sin[index].unsqueeze(1)  # (B, 1, D)
        interrupted = {}
        for layer_idx, layer in enumerate(self.layers):
            alive = rows_alive(rows, hooks, interrupted)
            if not alive:
                return {}, interrupted
            if len(alive) < len(rows):
                x, cos, sin = x[alive], cos[alive], sin[alive]
                rows = [rows[i] for i in alive]
            x = self._step_layer(layer_idx, layer, x, cos, sin, [caches[r] for r in rows])
        pool_steps(hooks, rows, x, len(self.layers))
        logits = self.lm_head(_rms_norm(x, self.final_norm), True)[0]  # (B, 1, vocab)
        return {row: logits[i, -1] for i, row in enumerate(rows)}, interrupted

    def _step_layer(self, layer_idx, layer, x, cos, sin, caches):
        """One decoder layer for B one-token rows; x: (B, 1, hidden) -> (B, 1, hidden).

        With 16-bit step weights (outputs differ from fp32 anyway) the elementwise work takes
        fewer kernels: fused RMSNorm, and RoPE on queries and keys at once with rotate_half
        as a (D, D) matrix. In the model's dtype the ops are transformers' own, so fp32
        steps match transformers.
        """
        n_rows, fast = x.shape[0], self.step_dtype is not None
        if layer.fused:
            return self._fused_step(layer_idx, layer, x, cos, sin, caches)
        h = self._norm(x, layer.input_norm, fast)
        q, k, v = layer.qkv(h, True)
        n_q = q.shape[-1] // layer.head_dim
        if fast:
            qk = torch.cat((q, k), dim=-1).view(n_rows, 1, -1, layer.head_dim)
            cos4, sin4 = cos.unsqueeze(2), sin.unsqueeze(2)  # (B, 1, 1, D)
            qk = torch.addcmul(qk * cos4, torch.matmul(qk, self.rotate), sin4).transpose(1, 2)
            q, k = qk[:, :n_q], qk[:, n_q:]
            v = v.view(n_rows, 1, -1, layer.head_dim).transpose(1, 2)
        else:
            q = q.view(n_rows, 1, -1, layer.head_dim).transpose(1, 2)
            k = k.view(n_rows, 1, -1, layer.head_dim).transpose(1, 2)
            v = v.view(n_rows, 1, -1, layer.head_dim).transpose(1, 2)
            cos4, sin4 = cos.unsqueeze(1), sin.unsqueeze(1)
            q = q * cos4 + _rotate_half(q) * sin4
            k = k * cos4 + _rotate_half(k) * sin4
        outs = []
        for i, cache in enumerate(caches):
            keys, values = cache.append(layer_idx, k[i:i + 1], v[i:i + 1])
            outs.append(F.scaled_dot_product_attention(
                q[i:i + 1], keys, values, scale=layer.scaling, enable_gqa=True))
        attn = (outs[0] if n_rows == 1 else torch.cat(outs)).transpose(1, 2)
        x = x + layer.out(attn.reshape(n_rows, 1, -1), True)[0]
        h = self._norm(x, layer.post_norm, fast)
        gate, up = layer.gate_up(h, True)
        return x + layer.down(F.silu(gate) * up, True)[0]

    @staticmethod
    def _norm(x, norm, fast):
        if fast:
            return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)
        return _rms_norm(x, norm)

    def _layer(self, layer_idx, layer, x, cos, sin, cache, step):
        """One decoder layer; x: (1, n, hidden) -> (1, n, hidden)."""
        n_tokens = x.shape[1]
        if step and n_tokens == 1 and layer.fused:
            return self._fused_step(layer_idx, layer, x, cos, sin, [cache])
        h = _rms_norm(x, layer.input_norm)
        if self._hooks.captures and not step:
            self._hooks.keep_inputs(layer_idx, layer.attn, h, cos, sin)
        q, k, v = layer.qkv(h, step)
        q = q.view(1, n_tokens, -1, layer.head_dim).transpose(1, 2)
        k = k.view(1, n_tokens, -1, layer.head_dim).transpose(1, 2)
        v = v.view(1, n_tokens, -1, layer.head_dim).transpose(1, 2)
        cos4, sin4 = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos4 + _rotate_half(q) * sin4
        k = k * cos4 + _rotate_half(k) * sin4
        n_before = cache.get_seq_length(layer_idx)
        keys, values = cache.append(layer_idx, k, v)
        mask = None
        if n_tokens > 1 and n_before > 0:  # a later prefill chunk: causal over the whole cache
            mask = torch.ones(n_tokens, n_before + n_tokens, dtype=torch.bool,
                              device=x.device).tril(diagonal=n_before)
        attn = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, is_causal=n_tokens > 1 and mask is None,
            scale=layer.scaling, enable_gqa=True)
        attn = attn.transpose(1, 2).reshape(1, n_tokens, -1)
        x = x + layer.out(attn, step)[0]
        h = _rms_norm(x, layer.post_norm)
        gate, up = layer.gate_up(h, step)
        return x + layer.down(F.silu(gate) * up, step)[0]

    def _fused_step(self, layer_idx, layer, x, cos, sin, caches):
        """One decoder layer of B one-token rows in one C++ call (all linears on GGUF blocks).

        x: (B, 1, hidden); cos / sin: (B, 1, D); caches: one KvCache a row. Rows are run
        ``kernels.MAX_ROWS`` at a time (each weight block decoded once for them).
        """
        n_kv = [cache.get_seq_length(layer_idx) for cache in caches]
        for cache, length in zip(caches, n_kv):
            cache.reserve(layer_idx, length + 1)
        rows = x.reshape(x.shape[0], -1).contiguous()
        cos, sin = cos.reshape(rows.shape[0], -1), sin.reshape(rows.shape[0], -1)
        outs = []
        for first in range(0, rows.shape[0], kernels.MAX_ROWS):
            part = slice(first, first + kernels.MAX_ROWS)
            outs.append(layer.qkv.kernels.layer_step(
                rows[part], layer.input_norm.weight, layer.input_norm.variance_epsilon,
                layer.qkv.gguf_blocks, layer.qkv.gguf_type, layer.out.gguf_blocks,
                layer.out.gguf_type, layer.post_norm.weight, layer.post_norm.variance_epsilon,
                layer.gate_up.gguf_blocks, layer.gate_up.gguf_type, layer.down.gguf_blocks,
                layer.down.gguf_type, cos[part].contiguous(), sin[part].contiguous(),
                [cache.keys[layer_idx] for cache in caches[part]],
                [cache.values[layer_idx] for cache in caches[part]], n_kv[part],
                layer.n_heads, layer.scaling))
        for cache, length in zip(caches, n_kv):
            cache.lengths[layer_idx] = length + 1
        return (outs[0] if len(outs) == 1 else torch.cat(outs)).view(x.shape)
