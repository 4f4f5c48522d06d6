"""The decoder every GGUF architecture family shares, and the spec a family fills in.

A family module (llama.py, qwen2.py, ...) reads its hyperparameters from the file into a
:class:`DecoderSpec` (``spec(gguf)``); :class:`GgufDecoder` runs any spec: pre-norm decoder
layers with grouped-query attention, rotary embeddings (rotate-half form; Llama's interleaved
query / key rows are reordered at load, as transformers does), optional query / key norms,
sandwich norms and sliding-window layers (Gemma 3), and a gated MLP (SiLU or tanh-GELU). The
weights stay the file's own blocks (engine/models/weights.py): no fp32 model is built.

The maths follows transformers' modules op for op in fp32 (RMSNorm in fp32, RoPE tables from
the same inverse frequencies), so logits match transformers on the same weights up to GEMM
summation order (test_gguf_models.py).

Shapes: n = tokens in the pass, H_q / H_kv = query / KV heads, D = head dim.
"""

import dataclasses
import functools
import math
from typing import Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from timebill_ros.engine import kernels
from timebill_ros.engine.forward import KvCacheForward, PassHooks, pool_steps, rows_alive
from timebill_ros.engine.gguf.file import GgufFile
from timebill_ros.engine.kv_cache import KvCache
from timebill_ros.engine.models.rope_table import Rope
from timebill_ros.engine.models.static_step import StaticSteps
from timebill_ros.engine.models.weights import DenseMatrix, dequantize, Matrix, weights_held

ACTIVATIONS = ('silu', 'gelu_tanh')  # kernels.decoder_step's activation ids: 0, 1
_EMPTY = torch.empty(0)  # an absent optional norm / bias of kernels.decoder_step
ATTENTION_BLOCK = 128  # queries a call of a masked prefill chunk's attention (_attend)


@dataclasses.dataclass(frozen=True)
class DecoderSpec:
    """What a family sets in the shared decoder (lengths in tokens, sizes in values).

    rope_base / rope_base_local: RoPE bases of global / sliding layers; rope_factors: Llama
    3's per-frequency divisors (``rope_freqs.weight``) or None; rope_linear: positions are
    divided by it (linear RoPE scaling). sliding_window: tokens a sliding layer sees (itself
    included), 0 = none; sliding_layers: one flag a layer. embed_scale: multiplies the
    embeddings (Gemma: sqrt(hidden)). permute_qk: the file's query / key rows are in
    llama.cpp's interleaved RoPE order (Llama). fused_qkv / fused_gate_up: one tensor holds
    q, k, v (``attn_qkv``) / gate then up (``ffn_up``) (Phi-3). qk_norm: per-head RMSNorm of
    queries and keys. post_norms: norms after attention and MLP (Gemma's sandwich).
    attention_scale: multiplies q.k.
    """

    arch: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    context_tokens: int
    norm_eps: float
    rope_base: float
    attention_scale: float
    activation: str = 'silu'
    rope_base_local: Optional[float] = None
    rope_factors: Optional[Tuple[float, ...]] = None
    rope_linear: float = 1.0
    sliding_window: int = 0
    sliding_layers: Tuple[bool, ...] = ()
    embed_scale: float = 1.0
    permute_qk: bool = False
    fused_qkv: bool = False
    fused_gate_up: bool = False
    qk_norm: bool = False
    post_norms: bool = False

    def __post_init__(self):
        """Check the values a file gave (ValueError naming the bad one)."""
        for name in ('n_layers', 'hidden', 'n_heads', 'n_kv_heads', 'head_dim',
                     'context_tokens'):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f'{self.arch}: {name} must be an int >= 1, got {value!r}')
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f'{self.arch}: {self.n_heads} query heads are not a multiple of '
                             f'{self.n_kv_heads} KV heads')
        if self.activation not in ACTIVATIONS:
            raise ValueError(f'{self.arch}: activation {self.activation!r} not in '
                             f'{ACTIVATIONS}')
        if self.sliding_layers and len(self.sliding_layers) != self.n_layers:
            raise ValueError(f'{self.arch}: sliding_layers has {len(self.sliding_layers)} '
                             f'flags for {self.n_layers} layers')

    def is_sliding(self, layer_idx: int) -> bool:
        """Return whether layer ``layer_idx`` attends over a sliding window."""
        return bool(self.sliding_window and self.sliding_layers
                    and self.sliding_layers[layer_idx])


def common_spec(gguf: GgufFile, **changes) -> DecoderSpec:
    """Return the spec of the ``<arch>.*`` keys every family has, with ``changes`` applied."""
    n_heads = int(gguf.require('attention.head_count'))
    hidden = int(gguf.require('embedding_length'))
    head_dim = int(gguf.arch_get('attention.key_length') or hidden // n_heads)
    n_kv = gguf.arch_get('attention.head_count_kv', n_heads)
    n_kv = int(n_kv[0] if isinstance(n_kv, (list, np.ndarray)) else n_kv)  # per layer: one
    factors = None
    if gguf.has('rope_freqs.weight'):
        factors = tuple(float(v) for v in gguf.vector('rope_freqs.weight'))
    linear = 1.0
    if gguf.arch_get('rope.scaling.type') == 'linear':
        linear = float(gguf.arch_get('rope.scaling.factor', 1.0))
    values = dict(
        arch=gguf.arch, n_layers=int(gguf.require('block_count')), hidden=hidden,
        n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
        context_tokens=int(gguf.arch_get('context_length', 4096)),
        norm_eps=float(gguf.require('attention.layer_norm_rms_epsilon')),
        rope_base=float(gguf.arch_get('rope.freq_base', 10000.0)),
        attention_scale=1.0 / math.sqrt(head_dim), rope_factors=factors, rope_linear=linear)
    values.update(changes)
    return DecoderSpec(**values)


def rope_row_order(n_rows: int, n_heads: int) -> np.ndarray:
    """Return the row order that turns llama.cpp's interleaved RoPE rows into rotate-half's.

    Row i of the reordered matrix is row order[i] of the file's (transformers' own reverse
    permutation of Llama GGUFs).
    """
    head_dim_half = n_rows // n_heads // 2
    rows = np.arange(n_rows).reshape(n_heads, head_dim_half, 2)
    return rows.swapaxes(2, 1).reshape(n_rows)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Return weight * x / sqrt(mean(x^2) + eps) over the last dim, in fp32 (torch's fused op).

    The same formula as transformers' RMSNorms in fp32 (test_gguf_models.py compares).
    """
    return F.rms_norm(x, weight.shape, weight, eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _Linears:
    """Several matrices applied to one input; same-type neighbours joined into one call."""

    def __init__(self, gguf: GgufFile, names, orders, biases=True, make=Matrix):
        """Read tensors ``names`` (rows reordered by ``orders``, None = as is).

        make: the matrix class and placement, ``make(data, type, N, K, bias=...)``: Matrix
        (the file's blocks for the CPU kernels) or a DenseMatrix partial (a device's copy);
        dense matrices join whatever their file types.
        """
        self.groups = []  # (Matrix, [rows of each output])
        pending = []
        dense = make is not Matrix
        for name, order in zip(names, orders):
            if (pending and not dense
                    and gguf.type_name(name) != gguf.type_name(pending[0][0])):
                self.groups.append(_joined(gguf, pending, biases, make))
                pending = []
            pending.append((name, order))
        self.groups.append(_joined(gguf, pending, biases, make))

    def __call__(self, x: torch.Tensor, gemm_dtype: torch.dtype = torch.float32):
        """Return each matrix's output for ``x``, in order (gemm_dtype: Matrix.__call__)."""
        outs = []
        for matrix, split in self.groups:
            y = matrix(x, gemm_dtype)
            outs.extend(y.split(split, dim=-1) if len(split) > 1 else (y,))
        return outs

    @property
    def nbytes(self) -> int:
        """Bytes the matrices hold."""
        return sum(matrix.nbytes for matrix, _ in self.groups)


def _joined(gguf: GgufFile, parts, biases: bool, make=Matrix):
    """Return (one matrix of the rows of ``parts`` stacked, rows of each part).

    make: as in :class:`_Linears`. Dense matrices of several file types are dequantized
    part by part and stacked as fp32 (each part exact).
    """
    datas, rows, bias_parts = [], [], []
    types = {gguf.type_name(name) for name, _ in parts}
    for name, order in parts:
        data = gguf.tensor(name)
        if len(types) > 1:  # dense only (_Linears joins one type for the kernels)
            data = dequantize(data, gguf.type_name(name), *gguf.shape(name))
        datas.append(data[order] if order is not None else data)
        n_rows, k = gguf.shape(name)
        rows.append(n_rows)
        bias_name = name.replace('.weight', '.bias')
        bias_parts.append(gguf.vector(bias_name)[order if order is not None else slice(None)]
                          if biases and gguf.has(bias_name) else np.zeros(n_rows, np.float32))
    has_bias = biases and any(gguf.has(n.replace('.weight', '.bias')) for n, _ in parts)
    data = datas[0] if len(datas) == 1 else np.concatenate(datas)
    bias = np.concatenate(bias_parts) if has_bias else None
    type_name = gguf.type_name(parts[0][0]) if len(types) == 1 else 'F32'
    return make(data, type_name, sum(rows), k, bias=bias), rows


class _Layer:
    """One decoder layer's weights: norms as fp32 vectors, matrices on the file's blocks."""

    def __init__(self, gguf: GgufFile, spec: DecoderSpec, i: int, make=Matrix,
                 place=lambda t: t):
        """Read layer ``i`` of ``gguf``.

        make: the matrices' class and placement (:class:`_Linears`); place(tensor): the
        norm vectors' (fp32 CPU tensors) move to the decoder's device and dtype.
        """
        def name(short):
            return f'blk.{i}.{short}.weight'

        def vector(short):
            return place(torch.from_numpy(gguf.vector(name(short))))

        self.attn_norm, self.ffn_norm = vector('attn_norm'), vector('ffn_norm')
        if spec.fused_qkv:
            self.qkv = _Linears(gguf, [name('attn_qkv')], [None], make=make)
        else:
            q_order = k_order = None
            if spec.permute_qk:
                q_order = rope_row_order(gguf.shape(name('attn_q'))[0], spec.n_heads)
                k_order = rope_row_order(gguf.shape(name('attn_k'))[0], spec.n_kv_heads)
            self.qkv = _Linears(gguf, [name('attn_q'), name('attn_k'), name('attn_v')],
                                [q_order, k_order, None], make=make)
        self.out = _Linears(gguf, [name('attn_output')], [None], make=make)
        if spec.fused_gate_up:
            self.gate_up = _Linears(gguf, [name('ffn_up')], [None], make=make)
        else:
            self.gate_up = _Linears(gguf, [name('ffn_gate'), name('ffn_up')], [None, None],
                                    make=make)
        self.down = _Linears(gguf, [name('ffn_down')], [None], make=make)
        self.q_norm = vector('attn_q_norm') if spec.qk_norm else None
        self.k_norm = vector('attn_k_norm') if spec.qk_norm else None
        self.post_attn_norm = vector('post_attention_norm') if spec.post_norms else None
        self.post_ffn_norm = vector('post_ffw_norm') if spec.post_norms else None
        self.fused = self._fusable()

    def _fusable(self) -> bool:
        """Return whether decoding steps can run as one C++ call (kernels.decoder_step).

        Every matrix on blocks, one matrix for the attention output and for down, and no bias
        but the query / key / value ones.
        """
        linears = (self.qkv, self.out, self.gate_up, self.down)
        if any(m.packed is None for lin in linears for m, _ in lin.groups):
            return False
        if len(self.out.groups) != 1 or len(self.down.groups) != 1:
            return False
        if any(m.bias is not None for lin in linears[1:] for m, _ in lin.groups):
            return False
        biases = [m.bias if m.bias is not None else torch.zeros(m.n_rows)
                  for m, _ in self.qkv.groups]
        has_bias = any(m.bias is not None for m, _ in self.qkv.groups)
        self.qkv_bias = torch.cat(biases) if has_bias else _EMPTY
        return True

    @staticmethod
    def parts(linears: '_Linears'):
        """Return (packed blocks, types, rows) of ``linears``' matrices, in order."""
        groups = [m for m, _ in linears.groups]
        return ([m.packed for m in groups], [m.qtype for m in groups],
                [m.n_rows for m in groups])

    @property
    def nbytes(self) -> int:
        """Bytes of the layer's matrices."""
        return sum(lin.nbytes for lin in (self.qkv, self.out, self.gate_up, self.down))


class ScorerView(torch.nn.Module):
    """What an eviction scorer (kvpress) reads of an attention layer, for a GGUF layer.

    ``q_proj(h)`` returns the queries before RoPE, (B, n, H_q x D), with the query norm
    already applied (kvpress applies transformers' own only to its Qwen3 / Gemma3 classes).
    """

    def __init__(self, decoder: 'GgufDecoder', layer: _Layer):
        """View ``layer`` of ``decoder``."""
        super().__init__()
        self.config = _HeadCounts(decoder.spec.n_heads, decoder.spec.n_kv_heads)
        self.head_dim = decoder.spec.head_dim
        self._decoder, self._layer = decoder, layer

    def q_proj(self, hidden: torch.Tensor) -> torch.Tensor:
        """Return the layer's queries for attention inputs ``hidden`` (B, n, hidden)."""
        q = self._decoder.project(self._layer, hidden)[0]
        return q.flatten(-2)


@dataclasses.dataclass(frozen=True)
class _HeadCounts:
    num_attention_heads: int
    num_key_value_heads: int


class GgufDecoder(KvCacheForward):
    """The forward pass of a GGUF model over a :class:`KvCache` (see the module docstring)."""

    name = 'gguf'
    max_batch = 64

    def __init__(self, gguf: GgufFile, spec: DecoderSpec, device=None,
                 dtype: torch.dtype = torch.float32):
        """Read every layer of ``gguf`` as ``spec`` describes it.

        device: None keeps the matrices as the file's blocks for the CPU kernels; a torch
        device (``cuda``, or ``cpu``) holds every matrix dequantized there in ``dtype``
        (DenseMatrix: GEMMs in that dtype) and decodes on static buffers
        (engine/models/static_step.py: CUDA graphs on a GPU). Activations, norms, attention
        and the KV cache stay fp32 on both paths: Gemma 3 270M's fp16 activations overflow
        (every answer NaN) and bf16 ones change greedy answers within 3-8 tokens, where fp16
        weights with fp32 activations answered as the fp32 reference (6 of 6 held-out
        prompts, 32 tokens, on the CPU, 2026-11-28).
        """
        self.gguf, self.spec = gguf, spec
        self.dense = device is not None
        self._device = torch.device(device) if self.dense else torch.device('cpu')
        if self.dense:
            make = functools.partial(DenseMatrix, device=self._device, dtype=dtype)
            self.kernels = None
        else:
            make, self.kernels = Matrix, kernels.load()
        self.layers = []
        for i in range(spec.n_layers):
            self.layers.append(_Layer(gguf, spec, i, make, self._place))
            gguf.release()  # the layer's blocks are copied: its file pages are not needed
        self.views = [ScorerView(self, layer) for layer in self.layers]
        self.embed = make(gguf.tensor('token_embd.weight'), gguf.type_name('token_embd.weight'),
                          *gguf.shape('token_embd.weight'))
        head = 'output.weight' if gguf.has('output.weight') else None
        self.lm_head = (make(gguf.tensor(head), gguf.type_name(head), *gguf.shape(head))
                        if head else self.embed)
        self.final_norm = self._place(torch.from_numpy(gguf.vector('output_norm.weight')))
        gguf.release()
        # The blocks path looks RoPE rows up (rope_table.py: no OpenMP region a step); the
        # dense path computes them in the step (a CUDA graph replays that computation).
        self.rope = Rope(spec, self._device, tabled=not self.dense)
        self._windows = [spec.sliding_window if spec.is_sliding(i) else 0
                         for i in range(spec.n_layers)]
        self._step_args = [self._step_arguments(layer) if layer.fused else None
                           for layer in self.layers]
        self._hooks = PassHooks()
        # The dtype of a prefill's matrix products (Matrix.__call__; the engine sets it from
        # engine.prefill_dtype); decoding steps are always fp32. Unused by dense matrices.
        self.prefill_dtype = torch.float32
        # The dense path's decoding steps on static buffers (None on the blocks path).
        self.static_steps = StaticSteps(self) if self.dense else None

    def twin(self) -> 'GgufDecoder':
        """Return a decoder on these weights with its own pass state and static buffers."""
        twin = super().twin()
        if self.dense:
            twin.static_steps = StaticSteps(twin, self.static_steps.max_bytes)
            twin.static_steps.graphs = self.static_steps.graphs
        return twin

    def _place(self, tensor: torch.Tensor) -> torch.Tensor:
        """Return a CPU fp32 vector (a norm's weight) on this decoder's device."""
        return tensor.to(self._device) if self.dense else tensor

    # -- what the engine reads -------------------------------------------------------------

    @property
    def n_layers(self) -> int:
        """Decoder layers."""
        return self.spec.n_layers

    @property
    def vocab_size(self) -> int:
        """Token ids the model scores (the LM head's rows)."""
        return self.lm_head.n_rows

    @property
    def context_tokens(self) -> int:
        """Most positions the model was trained for, tokens."""
        return self.spec.context_tokens

    @property
    def norm_eps(self) -> float:
        """The final norm's epsilon (what the length readout's pooling uses)."""
        return self.spec.norm_eps

    @property
    def device(self) -> torch.device:
        """Where the passes run: the CPU for the kernels, else the dense matrices' device."""
        return self._device

    @property
    def weight_bytes(self) -> int:
        """Bytes of every matrix kept (blocks in the kernels' layout, or dense on the device)."""
        head = 0 if self.lm_head is self.embed else self.lm_head.nbytes
        return sum(layer.nbytes for layer in self.layers) + self.embed.nbytes + head

    def new_cache(self) -> KvCache:
        """Return an empty fp32 cache on the decoder's device."""
        return KvCache(self.spec.n_layers, self.spec.n_kv_heads, self.spec.head_dim,
                       torch.float32, self._device)

    # -- the passes ------------------------------------------------------------------------

    def run(self, token_ids: list, position: int, cache: KvCache, step: bool) -> torch.Tensor:
        """Run the tokens at positions ``position``...; return the last logits, (vocab,)."""
        n_tokens = len(token_ids)
        ropes = self.rope.at(torch.arange(position, position + n_tokens))
        x = self._embed(token_ids).unsqueeze(0)  # (1, n, hidden)
        hooks = self._hooks
        masks = {}  # sliding window (0: none) -> the pass's mask, made once
        for layer_idx, layer in enumerate(self.layers):
            hooks.before_layer()
            cos, sin = ropes[self.rope.base_of(layer_idx)]
            window = self.spec.sliding_window if self.spec.is_sliding(layer_idx) else 0
            if window not in masks:
                masks[window] = _on(_mask(n_tokens, cache.get_seq_length(layer_idx), window),
                                    self._device)
            if step and n_tokens == 1:
                x = self._step_layer(layer_idx, layer, x, cos.unsqueeze(0), sin.unsqueeze(0),
                                     [cache])
            else:
                x = self._layer(layer_idx, layer, x, cos.unsqueeze(0), sin.unsqueeze(0), cache,
                                step, masks[window])
            if hooks.pool is not None and not step:
                hooks.pool.add(layer_idx + 1, x)
        return self._last_logits(x)

    def run_by_layer(self, token_ids: list, position: int, cache: KvCache,
                     sizes: list) -> torch.Tensor:
        """Prefill ``token_ids`` at positions ``position``... in chunks of ``sizes``, by layer.

        The arithmetic of one :meth:`run` a chunk (a chunk's layer attends to the keys of the
        chunks before it, in the cache), in another order: every chunk through layer 1, then
        through layer 2, ... Each layer's matrices are dequantized once for all its chunks
        (``weights_held``: one layer's weights held at a time) where a chunk at a time
        dequantizes every matrix for each chunk. The hooks' check runs before each layer of
        each chunk, as in :meth:`run`, with ``n_prefilled`` the positions done so far counted
        in whole passes (layers x tokens done / layers). Returns the last logits, (vocab,).
        """
        n_tokens, n_layers, hooks = len(token_ids), len(self.layers), self._hooks
        if sum(sizes) != n_tokens or min(sizes) < 1:
            raise ValueError(f'chunk sizes {sizes} do not cover {n_tokens} tokens')
        edges = [0]
        for size in sizes:
            edges.append(edges[-1] + size)
        ropes = self.rope.at(torch.arange(position, position + n_tokens))
        x = self._embed(token_ids).unsqueeze(0)  # (1, n, hidden)
        masks = {}  # (sliding window, chunk start) -> the chunk's mask, made once
        for layer_idx, layer in enumerate(self.layers):
            cos, sin = ropes[self.rope.base_of(layer_idx)]
            window = self.spec.sliding_window if self.spec.is_sliding(layer_idx) else 0
            outs = []
            with weights_held():
                for begin, end in zip(edges, edges[1:]):
                    hooks.n_prefilled = position + (layer_idx * n_tokens + begin) // n_layers
                    hooks.before_layer()
                    if (window, begin) not in masks:
                        masks[window, begin] = _on(_mask(end - begin, position + begin, window),
                                                   self._device)
                    out = self._layer(layer_idx, layer, x[:, begin:end],
                                      cos[begin:end].unsqueeze(0), sin[begin:end].unsqueeze(0),
                                      cache, False, masks[window, begin])
                    if hooks.pool is not None:
                        hooks.pool.add(layer_idx + 1, out)
                    outs.append(out)
            x = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        return self._last_logits(x)

    def _last_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Return the logits after the last position of a pass's output x (1, n, hidden)."""
        last = _rms_norm(x[:, -1:], self.final_norm, self.spec.norm_eps)
        return self.lm_head(last)[0, -1].float()

    def run_step(self, token_ids: list, positions: list, caches: list, hooks: list):
        """Run one decoding step of B goals together (see :meth:`Forward.run_step`).

        The dense path runs it on static buffers (StaticSteps; a CUDA graph on a GPU): the
        rows' interrupts are checked once before the step, not before each layer.
        """
        if self.static_steps is not None:
            return self.static_steps.run(token_ids, positions, caches, hooks)
        rows = list(range(len(token_ids)))
        x = self._embed(token_ids).unsqueeze(1)  # (B, 1, hidden)
        index = torch.tensor(positions, dtype=torch.long)
        ropes = self.rope.at(index)
        interrupted = {}
        for layer_idx, layer in enumerate(self.layers):
            alive = rows_alive(rows, hooks, interrupted)
            if not alive:
                return {}, interrupted
            if len(alive) < len(rows):
                x = x[alive]
                ropes = {base: (cos[alive], sin[alive]) for base, (cos, sin) in ropes.items()}
                rows = [rows[i] for i in alive]
            cos, sin = ropes[self.rope.base_of(layer_idx)]  # (B, D)
            x = self._step_layer(layer_idx, layer, x, cos.unsqueeze(1), sin.unsqueeze(1),
                                 [caches[r] for r in rows])
        pool_steps(hooks, rows, x, self.spec.n_layers)
        logits = self.lm_head(_rms_norm(x, self.final_norm, self.spec.norm_eps))
        return {row: logits[i, -1] for i, row in enumerate(rows)}, interrupted

    def _embed(self, token_ids) -> torch.Tensor:
        """Return the scaled embeddings of ``token_ids``, (n, hidden) fp32."""
        x = self.embed.rows(torch.tensor(token_ids, dtype=torch.long))
        if self.spec.embed_scale != 1.0:
            x = x * torch.tensor(self.spec.embed_scale, dtype=torch.float32)
        return x

    def project(self, layer: _Layer, h: torch.Tensor, gemm_dtype=torch.float32):
        """Return q (.., n, H_q, D), k, v (.., n, H_kv, D) of attention inputs ``h``.

        Query / key norms applied, RoPE not yet; gemm_dtype: Matrix.__call__'s.
        """
        spec = self.spec
        q_rows, kv_rows = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
        parts = layer.qkv(h, gemm_dtype)
        if spec.fused_qkv:
            parts = parts[0].split((q_rows, kv_rows, kv_rows), dim=-1)
        q, k, v = (p.unflatten(-1, (-1, spec.head_dim)) for p in parts)
        if layer.q_norm is not None:
            q = _rms_norm(q, layer.q_norm, spec.norm_eps)
            k = _rms_norm(k, layer.k_norm, spec.norm_eps)
        return q, k, v

    def _mlp(self, layer: _Layer, h: torch.Tensor, gemm_dtype) -> torch.Tensor:
        parts = layer.gate_up(h, gemm_dtype)
        gate, up = parts[0].chunk(2, dim=-1) if self.spec.fused_gate_up else parts
        if self.spec.activation == 'silu':
            act = F.silu(gate)
        else:
            act = F.gelu(gate, approximate='tanh')
        return layer.down(act * up, gemm_dtype)[0]

    def _fused_step(self, layer_idx, layer, x, cos, sin, caches):
        """One decoder layer of B one-token rows in one C++ call a ``MAX_ROWS`` rows.

        x: (B, 1, hidden); cos / sin: (B, 1, D); caches: one KvCache a row. What the torch
        ops of :meth:`_step_layer` compute, in the kernels (no Python and no OpenMP region
        between the GEMMs; each weight block decoded once for the rows). The layer's weights
        and sizes go in as the arguments made once at load (:meth:`_step_arguments`): this
        Python runs 28 times a step on a 28-layer model, between the weights' streams.
        """
        before, after = self._step_args[layer_idx]
        window = self._windows[layer_idx]
        n_kv = [cache.lengths[layer_idx] for cache in caches]
        for cache, length in zip(caches, n_kv):
            cache.reserve(layer_idx, length + 1)
        first = [_window_start(length, window) for length in n_kv]  # the query is at length
        n_rows = x.shape[0]
        rows, cos, sin = x.reshape(n_rows, -1), cos.reshape(n_rows, -1), sin.reshape(n_rows, -1)
        keys = [c.keys[layer_idx] for c in caches]
        values = [c.values[layer_idx] for c in caches]
        outs = [self.kernels.decoder_step(
            rows[part].contiguous(), *before, cos[part].contiguous(), sin[part].contiguous(),
            keys[part], values[part], n_kv[part], first[part], *after)
            for part in (slice(b, b + kernels.MAX_ROWS)
                         for b in range(0, n_rows, kernels.MAX_ROWS))]
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        for cache, length in zip(caches, n_kv):
            cache.lengths[layer_idx] = length + 1
        return out.view(x.shape)

    def _step_arguments(self, layer: _Layer) -> tuple:
        """Return kernels.decoder_step's arguments of ``layer`` before and after its inputs.

        (attention norm ... key norm) and (heads ... post-FFN norm): the weights, norms and
        sizes, the same every step.
        """
        spec = self.spec
        out, down = layer.out.groups[0][0], layer.down.groups[0][0]
        before = (layer.attn_norm, spec.norm_eps, *layer.parts(layer.qkv), layer.qkv_bias,
                  _or_empty(layer.q_norm), _or_empty(layer.k_norm))
        after = (spec.n_heads, spec.attention_scale, out.packed, out.qtype,
                 _or_empty(layer.post_attn_norm), layer.ffn_norm, *layer.parts(layer.gate_up),
                 ACTIVATIONS.index(spec.activation), down.packed, down.qtype,
                 _or_empty(layer.post_ffn_norm))
        return before, after

    def _finish(self, layer: _Layer, x, attn, gemm_dtype=torch.float32):
        """Add the attention output ``attn`` and the MLP to the residual ``x``."""
        eps = self.spec.norm_eps
        h = layer.out(attn, gemm_dtype)[0]
        if layer.post_attn_norm is not None:
            h = _rms_norm(h, layer.post_attn_norm, eps)
        x = x + h
        h = self._mlp(layer, _rms_norm(x, layer.ffn_norm, eps), gemm_dtype)
        if layer.post_ffn_norm is not None:
            h = _rms_norm(h, layer.post_ffn_norm, eps)
        return x + h

    def _layer(self, layer_idx, layer, x, cos, sin, cache, step, mask):
        """One decoder layer over n tokens; x: (1, n, hidden) -> (1, n, hidden).

        mask: the pass's attention mask for this layer's window (_mask), or None: causal.
        """
        spec, n_tokens = self.spec, x.shape[1]
        gemm_dtype = torch.float32 if step else self.prefill_dtype
        h = _rms_norm(x, layer.attn_norm, spec.norm_eps)
        if self._hooks.captures and not step:
            self._hooks.keep_inputs(layer_idx, self.views[layer_idx], h, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in self.project(layer, h, gemm_dtype))  # (1,H,n,D)
        cos4, sin4 = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos4 + _rotate_half(q) * sin4
        k = k * cos4 + _rotate_half(k) * sin4
        start = _window_start(cache.get_seq_length(layer_idx), spec.sliding_window
                              if spec.is_sliding(layer_idx) else 0)
        keys, values = cache.append(layer_idx, k, v)
        if start:  # a sliding layer: only the keys this chunk's queries can see
            keys, values = keys[:, :, start:], values[:, :, start:]
        attn = self._attend(q, keys, values, mask)
        return self._finish(layer, x, attn.transpose(1, 2).reshape(1, n_tokens, -1),
                            gemm_dtype)

    def _attend(self, q, keys, values, mask):
        """Attention of a chunk's queries q (1, H_q, n, D) over keys / values (1, H_kv, S, D).

        mask: (n, S) bool (_mask) or None (causal, or one query). A masked chunk runs in
        blocks of ``ATTENTION_BLOCK`` queries, each over the keys its rows can see: the keys
        after a block's last query and, in a sliding layer, before its first query's window
        cost nothing (one masked call would compute every (query, key) pair).
        """
        scale, n_tokens = self.spec.attention_scale, q.shape[2]
        if self._device.type == 'cuda':
            return _attend_whole(q, keys, values, mask, scale)
        if mask is None:
            return F.scaled_dot_product_attention(
                q, keys, values, is_causal=n_tokens > 1, scale=scale, enable_gqa=True)
        outs = []
        for begin in range(0, n_tokens, ATTENTION_BLOCK):
            rows = mask[begin:begin + ATTENTION_BLOCK]
            first = int(rows[0].to(torch.uint8).argmax())  # the band's first visible key
            end = int(rows[-1].nonzero()[-1]) + 1  # ... and one past its last
            outs.append(F.scaled_dot_product_attention(
                q[:, :, begin:begin + ATTENTION_BLOCK], keys[:, :, first:end],
                values[:, :, first:end], attn_mask=rows[:, first:end], scale=scale,
                enable_gqa=True))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

    def _step_layer(self, layer_idx, layer, x, cos, sin, caches):
        """One decoder layer for B one-token rows; x: (B, 1, hidden) -> (B, 1, hidden)."""
        spec, n_rows = self.spec, x.shape[0]
        if layer.fused:
            return self._fused_step(layer_idx, layer, x, cos, sin, caches)
        h = _rms_norm(x, layer.attn_norm, spec.norm_eps)
        q, k, v = (t.transpose(1, 2) for t in self.project(layer, h))  # (B, H, 1, D)
        cos4, sin4 = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos4 + _rotate_half(q) * sin4
        k = k * cos4 + _rotate_half(k) * sin4
        window = spec.sliding_window if spec.is_sliding(layer_idx) else 0
        first, n_live = [], []
        for i, cache in enumerate(caches):
            cache.append(layer_idx, k[i:i + 1], v[i:i + 1])
            live = cache.get_seq_length(layer_idx)
            first.append(max(0, live - window) if window else 0)
            n_live.append(live - first[-1])
        if self.dense:
            attn = torch.cat([_attend_live(q[i:i + 1], cache, layer_idx, first[i],
                                           spec.attention_scale)
                              for i, cache in enumerate(caches)])
            return self._finish(layer, x, attn.view(n_rows, 1, -1))
        # The kernels' attention (no torch op: torch's OpenMP workers would spin on the cores
        # the kernels' own threads need between their GEMMs).
        attn = self.kernels.attention_step(
            q.reshape(n_rows, -1).contiguous(), [c.keys[layer_idx] for c in caches],
            [c.values[layer_idx] for c in caches], first, n_live, spec.n_heads,
            spec.attention_scale)
        return self._finish(layer, x, attn.view(n_rows, 1, -1))


def _attend_whole(q, keys, values, mask, scale: float) -> torch.Tensor:
    """Attention of a chunk on a GPU in one call, KV heads repeated for each query group.

    q: (1, H_q, n, D) fp32; keys / values (1, H_kv, S, D); mask (n, S) bool or None (causal,
    or one query). torch's fp32 SDPA with ``enable_gqa`` or a mask falls back to its math
    kernel, which holds every (query, key) score: a 4k-token prefill of SmolLM2 took 0.10 s,
    a 3k-token one of Gemma 3 (sliding windows, masked in blocks of 128 queries) 2.6 s on an
    H200 (2026-11-28). With the heads repeated the memory-efficient kernel takes the whole
    chunk, masked or causal, in fp32.
    """
    group = q.shape[1] // keys.shape[1]
    if group > 1:
        keys = keys.repeat_interleave(group, dim=1)
        values = values.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                          is_causal=mask is None and q.shape[2] > 1,
                                          scale=scale)


def _attend_live(q, cache: KvCache, layer_idx: int, first: int, scale: float):
    """Return one query row's attention over a cache layer's live keys from ``first``.

    q: (1, H_q, 1, D); returns (1, H_q x D). The dense path's eager step (torch's SDPA).
    """
    keys, values = cache.layer_kv(layer_idx)
    out = F.scaled_dot_product_attention(q, keys[:, :, first:], values[:, :, first:],
                                         scale=scale, enable_gqa=True)
    return out.reshape(1, -1)


def _on(mask: Optional[torch.Tensor], device: torch.device) -> Optional[torch.Tensor]:
    """Return ``mask`` (or None) on ``device``."""
    return mask if mask is None or mask.device == device else mask.to(device)


def _or_empty(tensor: Optional[torch.Tensor]) -> torch.Tensor:
    return _EMPTY if tensor is None else tensor


def _window_start(n_before: int, window: int) -> int:
    """Return the first cached position a chunk after ``n_before`` tokens can attend to.

    0 without a sliding window; with one, the first query (position n_before) sees the
    ``window`` positions up to itself.
    """
    return max(0, n_before - window + 1) if window else 0


def _mask(n_tokens: int, n_before: int, window: int) -> Optional[torch.Tensor]:
    """Return a chunk's bool mask over keys [start, n_before + n), or None: causal will do.

    start = _window_start(n_before, window). Query i (position n_before + i) sees key j when
    j <= n_before + i and, with a sliding window, n_before + i - j < window.
    """
    total, start = n_before + n_tokens, _window_start(n_before, window)
    if n_tokens == 1 or (n_before == 0 and (not window or n_tokens <= window)):
        return None  # one query sees every key kept; or a first chunk inside the window
    query = torch.arange(n_before, total).unsqueeze(1)
    key = torch.arange(start, total).unsqueeze(0)
    allowed = key <= query
    if window:
        allowed &= (query - key) < window
    return allowed
