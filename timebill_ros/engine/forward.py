"""The forward-pass interface the engine runs on, and what it asks of every pass.

Two implementations: ``hf_forward.TransformersForward`` (any transformers causal LM,
DynamicCache, module hooks) and ``lean_llama.LeanLlamaForward`` (Llama-family models, a
preallocated KV cache, optional 16-bit decode weights). Both call :class:`PassHooks` before
every decoder layer (interrupts) and, during the prefill, with each attention layer's input
(what the eviction scorer needs), and with the outputs of the decoder layers the length
readout pools (:class:`HiddenPool`).
"""

import contextlib
import copy
import dataclasses
from typing import Callable, Optional, Sequence

import torch

from timebill_ros.engine.stopping import StopCriteria


def synchronize(device) -> None:
    """Wait until ``device`` (a torch.device or its name) has run its queued work: CUDA only.

    The one helper every clock read that times device work calls first (the engine's timed
    prefills and steps, the start-up probes, calibration, the online time model's
    observations, enginebench, the latency study). On the CPU the work is done when the
    call that queued it returns: nothing to wait for (~0.3 us a call here).
    """
    if not isinstance(device, torch.device):
        device = torch.device(device)
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def avoid_cudnn_attention(device) -> bool:
    """Turn torch's cuDNN attention backend off when ``device`` is a CUDA device.

    Return True when it did. The flag is process-wide (``torch.backends.cuda``): the
    scaled-dot-product attention then runs on the flash, memory-efficient or math kernels,
    none of which plans per shape. torch's cuDNN attention builds an execution graph for each
    new query / key length, and decoding gives every step a new KV length: on an H200 (torch
    2.11, 2026-11-27, docs/gpu.md) that cost ~1.8 ms of CPU per layer and step, 40-71 ms a
    token where the same steps took 11-13 ms with it off; a new thread built its graphs again.
    A prompt of a new length paid it in the prefill too.
    """
    if not isinstance(device, torch.device):
        device = torch.device(device)
    if device.type != 'cuda':
        return False
    torch.backends.cuda.enable_cudnn_sdp(False)
    return True


class Interrupted(Exception):
    """Raised before a decoder layer to abandon a forward pass; ``reason`` as in stopping.py."""

    def __init__(self, reason: str):
        """Keep ``reason``."""
        super().__init__(reason)
        self.reason = reason


@dataclasses.dataclass
class ScorerInputs:
    """What one layer's scorer needs, captured during the prefill.

    module: the attention module. hidden_states: its input at the last ``window_size + 1``
    prompt positions, (1, W + 1, hidden). kwargs: ``position_embeddings`` (cos, sin) of those
    positions, each (1, W + 1, head_dim).
    """

    module: torch.nn.Module
    hidden_states: torch.Tensor
    kwargs: dict


def unit_rms(hidden: torch.Tensor, eps: float) -> torch.Tensor:
    """Return rows ``hidden`` (n, hidden) scaled to unit RMS, fp32: x / sqrt(mean(x^2) + eps)."""
    x = hidden.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class HiddenPool:
    """Pools decoder layers' outputs over a prefill, chunk by chunk.

    Each position's hidden state is scaled to unit RMS (an RMSNorm without its weight:
    x / sqrt(mean(x^2) + eps), computed in fp32); the pool keeps, per layer, the last
    position's and the running sum over positions. The length readout reads
    ``weight * [last, mean]`` (for the last layer that is the RLP's pooling of the final-normed
    states: the norm's weight is per channel, so it commutes with the mean).
    eps: the final norm's epsilon. layers: the decoder layers pooled, 1-based (the model's
    last layer is its count), in the order :meth:`features` lays them out.
    """

    def __init__(self, eps: float, layers: Sequence[int], block_tokens: int = 0):
        """Start an empty pool of ``layers`` normalising with ``eps``.

        block_tokens: > 0 also keeps the sum over each block of that many positions
        (:meth:`block_sum`; what the prefix store keeps beside a block's KV).
        """
        if not layers or any(not isinstance(n, int) or n < 1 for n in layers):
            raise ValueError(f'layers must be 1-based layer numbers, got {layers!r}')
        self.eps = float(eps)
        self.layers = tuple(layers)
        self.block_tokens = block_tokens
        self.n_positions = dict.fromkeys(self.layers, 0)
        self.last = {}
        self.total = {}
        self.blocks = {n: {} for n in self.layers}  # layer -> block index -> sum (hidden,)

    def seed(self, sums: torch.Tensor, n_positions: int) -> None:
        """Start from positions pooled elsewhere: ``sums`` (layers, hidden) over ``n_positions``.

        A prefill that copies a cached prompt head pools only the rest; the head's sums come
        from the prefix store (``last`` comes from the rest, which is never empty).
        """
        for row, layer in enumerate(self.layers):
            self.total[layer] = sums[row].clone()
            self.n_positions[layer] = n_positions

    def add(self, layer: int, hidden: torch.Tensor) -> None:
        """Pool one chunk of ``layer``'s output, (1, n, hidden), in position order."""
        if layer not in self.n_positions:
            return
        unit = unit_rms(hidden[0], self.eps)
        chunk_sum = unit.sum(0)
        self.total[layer] = chunk_sum + self.total.get(layer, 0.0)
        self.last[layer] = unit[-1].clone()
        if self.block_tokens:
            self._add_blocks(self.blocks[layer], unit, self.n_positions[layer])
        self.n_positions[layer] += unit.shape[0]

    def _add_blocks(self, sums: dict, unit: torch.Tensor, begin: int) -> None:
        """Add the rows of ``unit`` (n, hidden), positions ``begin``..., to their blocks' sums.

        The whole blocks inside the chunk are summed in one call (a kernel launch a block
        and layer added up on a GPU); a block cut by the chunk's edges is summed on its own.
        """
        size, row, n_rows = self.block_tokens, 0, unit.shape[0]
        if begin % size:  # the rest of a block an earlier chunk began
            row = min(n_rows, size - begin % size)
            self._add_block(sums, begin // size, unit[:row].sum(0))
        n_whole = (n_rows - row) // size
        if n_whole:
            whole = unit[row:row + n_whole * size].view(n_whole, size, -1).sum(1)
            first = (begin + row) // size
            for i in range(n_whole):
                self._add_block(sums, first + i, whole[i])
            row += n_whole * size
        if row < n_rows:  # a block the next chunk goes on with
            self._add_block(sums, (begin + row) // size, unit[row:].sum(0))

    @staticmethod
    def _add_block(sums: dict, index: int, part: torch.Tensor) -> None:
        sums[index] = part + sums[index] if index in sums else part

    def block_sum(self, index: int) -> Optional[torch.Tensor]:
        """Return block ``index``'s sums of every pooled layer, (layers, hidden), or None."""
        if any(index not in self.blocks[n] for n in self.layers):
            return None
        return torch.stack([self.blocks[n][index] for n in self.layers])

    def features(self) -> Optional[torch.Tensor]:
        """Return [last of each layer, mean of each layer], (1, 2 x layers x hidden) fp32.

        None until every layer has been pooled.
        """
        if any(n == 0 for n in self.n_positions.values()):
            return None
        means = [self.total[n] / self.n_positions[n] for n in self.layers]
        return torch.cat([self.last[n] for n in self.layers] + means).unsqueeze(0)


class PassHooks:
    """Per-layer work the engine wants done during forward passes.

    interrupt: checked before every decoder layer (none registered when it has no criteria);
    ``n_generated`` / ``n_prefilled`` are set by the engine before each pass and handed to it.
    n_positions: > 0 keeps each attention layer's last ``n_positions`` inputs in ``inputs``
    (layer index -> ScorerInputs), across chunk edges. pool: a :class:`HiddenPool` the
    prefill passes add its layers' outputs to (None: not pooled). answer_pool: a
    :class:`HiddenPool` of the last layer the decoding steps add each step's output to (the
    answer's states: what a remaining-length readout reads; None: not pooled; forwards
    without :func:`pool_steps` leave it empty). wait: called before each
    interrupt check (a CUDA synchronize: the GPU runs the layers queued before it, so a check
    at launch time alone would let a stop wait for the whole queued pass).
    """

    def __init__(self, interrupt: Optional[StopCriteria] = None, n_positions: int = 0,
                 pool: Optional[HiddenPool] = None, wait: Optional[Callable[[], None]] = None):
        """Check ``interrupt`` per layer; capture ``n_positions`` attention inputs (0: none)."""
        self.interrupt = interrupt if interrupt is not None and interrupt.criteria else None
        self.wait = wait
        self.n_positions = n_positions
        self.pool = pool
        self.answer_pool = None
        self.n_generated = 0
        self.n_prefilled = None
        self.inputs = {}

    @property
    def checks_layers(self) -> bool:
        """True when something is checked before each layer."""
        return self.interrupt is not None

    @property
    def captures(self) -> bool:
        """True when attention inputs are kept."""
        return self.n_positions > 0

    def before_layer(self) -> None:
        """Raise :class:`Interrupted` when an interrupt criterion fires."""
        if self.interrupt is None:
            return
        if self.wait is not None:
            self.wait()
        reason = self.interrupt.check(self.n_generated, None, self.n_prefilled)
        if reason is not None:
            raise Interrupted(reason)

    def keep_inputs(self, layer_idx: int, module, hidden, cos, sin) -> None:
        """Keep the last ``n_positions`` attention inputs of layer ``layer_idx``.

        hidden: (1, n, hidden); cos, sin: (1, n, head_dim). A chunk shorter than the window is
        prepended with the tail of the chunks before it.
        """
        previous = self.inputs.get(layer_idx)
        if previous is not None and hidden.shape[1] < self.n_positions:
            old_cos, old_sin = previous.kwargs['position_embeddings']
            hidden = torch.cat([previous.hidden_states, hidden], dim=1)
            cos, sin = torch.cat([old_cos, cos], dim=1), torch.cat([old_sin, sin], dim=1)
        tail = -self.n_positions
        # clone(): a slice would keep the whole chunk's tensors alive.
        self.inputs[layer_idx] = ScorerInputs(
            module, hidden[:, tail:].clone(),
            {'position_embeddings': (cos[:, tail:].clone(), sin[:, tail:].clone())})


def pool_steps(hooks: list, rows: list, hidden: torch.Tensor, layer: int) -> None:
    """Add each row's step output to its hooks' ``answer_pool`` (rows without one: nothing).

    hidden: the last decoder layer's output of the step, before the final norm, (B, 1,
    hidden) or (B, hidden), row i of it being batch row ``rows[i]``; layer: its number
    (1-based, the model's layer count).
    """
    for i, row in enumerate(rows):
        pool = hooks[row].answer_pool
        if pool is not None:
            pool.add(layer, hidden[i].reshape(1, 1, -1))


def rows_alive(rows: list, hooks: list, interrupted: dict) -> list:
    """Return the indices (into ``rows``) of the batch rows whose interrupts let them go on.

    Calls each row's ``hooks[row].before_layer()``; a row that is interrupted is recorded in
    ``interrupted`` (row -> reason) and left out. What a batched step does before a layer.
    """
    alive = []
    for i, row in enumerate(rows):
        try:
            hooks[row].before_layer()
            alive.append(i)
        except Interrupted as exc:
            interrupted[row] = exc.reason
    return alive


class Forward:
    """A model's forward pass over a KV cache; subclasses override the methods below.

    The model facts the engine reads (``n_layers``, ``context_tokens``, ``norm_eps``,
    ``device``) default to a transformers model held as ``self.model``.
    """

    name = 'base'

    def twin(self) -> 'Forward':
        """Return a forward sharing this one's weights (KvCacheForward does)."""
        raise NotImplementedError(f'the {self.name} forward does not share its weights')

    @property
    def n_layers(self) -> int:
        """Decoder layers (the granularity of interrupts)."""
        return len(self.model.model.layers)

    @property
    def context_tokens(self) -> int:
        """Most positions the model handles (prompt + answer), tokens."""
        return int(self.model.config.max_position_embeddings)

    @property
    def norm_eps(self) -> float:
        """The final norm's epsilon (the length readout's pooling uses it)."""
        norm = self.model.model.norm
        eps = getattr(norm, 'variance_epsilon', None)  # Llama's name; Gemma's is ``eps``
        return float(norm.eps if eps is None else eps)

    @property
    def device(self) -> torch.device:
        """The torch device the passes run on."""
        return self.model.device

    def synchronize(self) -> None:
        """Wait until the device has run every queued pass (CUDA); nothing on the CPU.

        Called before a clock read that times device work, and between layers where a stop
        must land within one layer (:class:`PassHooks` ``wait``). The device is looked up
        once (the model does not move; transformers' ``model.device`` walks the parameters,
        ~3 us): on the CPU a call then costs ~0.3 us here.
        """
        device = self.__dict__.get('_synchronize_device')
        if device is None:
            device = self._synchronize_device = self.device
        synchronize(device)

    def layer_wait(self) -> Optional[Callable[[], None]]:
        """Return what :class:`PassHooks` calls before each layer's check: None on the CPU."""
        return self.synchronize if self.device.type == 'cuda' else None

    def new_cache(self):
        """Return an empty KV cache for one goal."""
        raise NotImplementedError

    def hooked(self, hooks: PassHooks):
        """Context manager: passes run inside it call ``hooks``."""
        return contextlib.nullcontext()

    def run(self, token_ids: list, position: int, cache, step: bool) -> torch.Tensor:
        """Run ``token_ids`` at true positions ``position``...; return the last logits, (vocab,).

        step: True for a one-token decoding step (16-bit decode weights apply), False for a
        prefill chunk.
        """
        raise NotImplementedError

    max_batch = 1  # rows one :meth:`run_step` can take

    def run_step(self, token_ids: list, positions: list, caches: list, hooks: list):
        """Run one decoding step of B goals, row r: ``token_ids[r]`` at ``positions[r]``.

        Each row has its own cache and its own :class:`PassHooks`; a row whose interrupt
        fires before a layer leaves the step there, the others go on. Returns
        ``(logits, interrupted)``: row -> last logits (vocab,), row -> stop reason.
        This default takes one row (B = 1) through :meth:`run`.
        """
        if len(token_ids) != 1:
            raise ValueError(f'{self.name} forward decodes one goal per step, got '
                             f'{len(token_ids)}')
        with self.hooked(hooks[0]):
            try:
                return {0: self.run(token_ids[:1], positions[0], caches[0], True)}, {}
            except Interrupted as exc:
                return {}, {0: exc.reason}

    def layer_kv(self, cache, layer_idx: int):
        """Return layer ``layer_idx``'s live keys and values, each (1, H, N, D)."""
        raise NotImplementedError

    def keep(self, cache, layer_idx: int, indices: torch.Tensor) -> None:
        """Keep positions ``indices`` (1, H, K), ascending, of layer ``layer_idx``."""
        raise NotImplementedError

    def append_kv(self, cache, layer_idx: int, keys: torch.Tensor, values: torch.Tensor):
        """Write ``keys`` / ``values`` (1, H, n, D) after layer ``layer_idx``'s live tokens.

        How a cached prompt head (engine/prefix_store.py) enters a new goal's cache.
        """
        raise NotImplementedError


class KvCacheForward(Forward):
    """A forward over a :class:`~timebill_ros.engine.kv_cache.KvCache`, its hooks in ``_hooks``.

    The cache and hook methods the lean Llama forward and the GGUF decoder share.
    """

    def twin(self) -> 'KvCacheForward':
        """Return a forward on this one's weights with its own pass state (its hooks).

        The weights (and every table made at load) are read-only in passes: two engines, each
        on its own thread, can run their passes at once on one copy (the offload executor).
        """
        twin = copy.copy(self)
        twin._hooks = PassHooks()
        return twin

    def hooked(self, hooks: PassHooks):
        """Context manager: passes inside it call ``hooks``."""
        return UsingHooks(self, hooks)

    def layer_kv(self, cache, layer_idx: int):
        """Return layer ``layer_idx``'s live keys and values, each (1, H_kv, N, D)."""
        return cache.layer_kv(layer_idx)

    def keep(self, cache, layer_idx: int, indices: torch.Tensor) -> None:
        """Keep positions ``indices`` (1, H_kv, K) of layer ``layer_idx``."""
        cache.keep(layer_idx, indices)

    def append_kv(self, cache, layer_idx: int, keys: torch.Tensor,
                  values: torch.Tensor) -> None:
        """Write ``keys`` / ``values`` (1, H_kv, n, D) after layer ``layer_idx``'s tokens."""
        cache.append(layer_idx, keys, values)


class UsingHooks:
    """Context manager: a forward's passes call ``hooks`` (its ``_hooks``) inside it."""

    def __init__(self, forward, hooks: PassHooks):
        """Set ``hooks`` on ``forward`` (a forward keeping its hooks as ``_hooks``)."""
        self.forward, self.hooks = forward, hooks

    def __enter__(self):
        self.previous, self.forward._hooks = self.forward._hooks, self.hooks
        return self.hooks

    def __exit__(self, *exc):
        self.forward._hooks = self.previous
