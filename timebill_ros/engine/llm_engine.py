"""LLM engine: chunked prefill, KV-cache eviction chosen after the prefill, greedy decoding.

The forward pass runs on a :class:`~timebill_ros.engine.forward.Forward` chosen by
``engine.forward``: the lean Llama forward on a preallocated KV cache (Llama-family models,
optional 16-bit decode weights) or transformers' own modules on a DynamicCache (every other
model). The prefill evicts nothing: it keeps what the scorer needs (each attention layer's
input at the last ``window_size + 1`` prompt positions and their RoPE ``position_embeddings``);
:meth:`LlmEngine.evict` then scores the full prompt keys of each layer with a kvpress scorer
and keeps the best positions per layer and KV head. Decoding feeds the true positions
(N_x, N_x + 1, ...) although the evicted cache is shorter, so RoPE stays right.

Stopping: ``stop`` criteria are checked before every prefill chunk and decoding step; the
``interrupt`` criteria (cancel, the Kill deadline) are also checked before every decoder layer
and between the layers of an eviction, so a stop lands within one layer of work (tens of ms
here) even inside a long prefill chunk. An interrupted forward pass leaves the cache
half-written: the goal it belongs to is over, its state is discarded.
The chunk sizes of a prefill come from a per-call ``chunk_plan`` (the server sizes them from
the time model); the observation window is captured across chunk edges, so any chunking works.

Not thread-safe: one caller at a time. Never imports rclpy.
"""

import copy
import dataclasses
import time
from typing import Callable, Optional

import torch

from timebill_ros.config import EngineConfig, EvictionConfig, PrefixCacheConfig
from timebill_ros.engine import model_source
from timebill_ros.engine.chat import encode_chat
from timebill_ros.engine.decode_batch import DecodeBatch, DecodeResult
from timebill_ros.engine.forward import HiddenPool, Interrupted, PassHooks
from timebill_ros.engine.eviction import keep_indices, make_scorer, n_keep_for, windowed
from timebill_ros.engine.loading import DTYPES, load_model, make_forward, random_ids
from timebill_ros.engine.prefix_kv import keep_prefix, load_prefix
from timebill_ros.engine.prefix_store import PrefixMatch, PrefixStore
from timebill_ros.engine.stopping import StopCriteria

__all__ = ['DTYPES', 'DecodeResult', 'GenerationStopped', 'LlmEngine', 'PrefillState',
           'fixed_chunks', 'make_forward']


class GenerationStopped(Exception):
    """A prefill or eviction was stopped by a stop criterion (a stopping.py reason)."""

    def __init__(self, reason: str):
        """Keep ``reason`` (e.g. ``'canceled'``, ``'deadline'``)."""
        super().__init__(f'generation stopped: {reason}')
        self.reason = reason


@dataclasses.dataclass
class PrefillState:
    """Result of :meth:`LlmEngine.prefill`, consumed by ``evict`` and ``decode``.

    cache: the forward's KV cache, N_x tokens per layer until evicted. n_x: prompt tokens.
    first_token: greedy token after the prompt (generated token 1).
    scorer_inputs: per layer index, or None once released. prefill_s: wall seconds.
    n_chunks: forward passes the prefill took (each pays a per-call overhead).
    n_cached: prompt tokens copied from the prefix store instead of prefilled (0: none).
    logits: the last prompt position's logits, (vocab,): what a sampled token 1 is drawn from.
    pooled: the outputs of the engine's ``pool_layers`` pooled over the prompt
    (engine.forward.HiddenPool: [last, mean] of the unit-RMS rows, layer by layer),
    (1, 2 x layers x hidden) fp32; what the length readout reads.
    n_prompt_kv: prompt tokens still cached per layer (N_x until an eviction).
    prompt_scores: per layer index, the scorer's scores of the prompt tokens still cached,
    (1, H, n_prompt_kv) (the observation window +inf), once an eviction has scored them; a
    later eviction (during decoding) keeps the best of these.
    answer_pool: None, or a HiddenPool of the last decoder layer that decoding fills with the
    answer's states (one row a step: the output that chose the next token); set by whoever
    reads a remaining-length readout before the goal decodes (DecodeReadout.start).
    """

    cache: object
    n_x: int
    first_token: int
    scorer_inputs: Optional[dict]
    prefill_s: float
    n_chunks: int = 1
    pooled: Optional[torch.Tensor] = None
    n_cached: int = 0
    logits: Optional[torch.Tensor] = None
    n_prompt_kv: Optional[int] = None
    prompt_scores: Optional[dict] = None
    answer_pool: Optional[object] = None

    def __post_init__(self):
        if self.n_prompt_kv is None:
            self.n_prompt_kv = self.n_x

    @property
    def n_kv(self) -> int:
        """Tokens now held in the cache per layer."""
        return self.cache.get_seq_length()


def fixed_chunks(chunk_tokens: int) -> Callable[[int, int], int]:
    """Return a chunk plan giving ``chunk_tokens`` tokens per prefill chunk."""
    if not isinstance(chunk_tokens, int) or isinstance(chunk_tokens, bool) or chunk_tokens < 1:
        raise ValueError(f'chunk_tokens must be an int >= 1, got {chunk_tokens!r}')
    return lambda begin, n_tokens: chunk_tokens


def _chunk_size(plan, begin: int, n_tokens: int) -> int:
    """Ask ``plan(begin, n_tokens)`` for the next chunk, tokens, clamped to what is left."""
    size = plan(begin, n_tokens)
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f'chunk plan gave {size!r} tokens at position {begin}; need an int >= 1')
    return min(size, n_tokens - begin)


def _chunk_sizes(plan, begin: int, n_tokens: int) -> list:
    """Return the sizes of the chunks ``plan`` cuts positions [begin, n_tokens) into."""
    sizes = []
    while begin < n_tokens:
        sizes.append(_chunk_size(plan, begin, n_tokens))
        begin += sizes[-1]
    return sizes


def _merged(stop: StopCriteria, interrupt: Optional[StopCriteria]) -> StopCriteria:
    """Return the criteria of ``stop`` and of ``interrupt`` (each once) as one."""
    extra = [c for c in (interrupt.criteria if interrupt is not None else ())
             if c not in stop.criteria]
    return StopCriteria(list(stop.criteria) + extra)


def _checked_ids(input_ids, vocab: int, context_tokens: int) -> list:
    """Return ``input_ids`` as a list after checking type, range (< ``vocab``) and length."""
    if not isinstance(input_ids, (list, tuple)) or not input_ids:
        raise TypeError(f'input_ids must be a non-empty list of ints, got {input_ids!r}')
    bad = [t for t in input_ids if not isinstance(t, int) or not 0 <= t < vocab]
    if bad:
        raise ValueError(f'input_ids hold ids outside [0, {vocab}): {bad[:5]!r}')
    if len(input_ids) > context_tokens:
        raise ValueError(f'prompt of {len(input_ids)} tokens exceeds the context of '
                         f'{context_tokens} tokens')
    return list(input_ids)


# torch's intra-op threads at import, before any engine sets its own (engine.threads: 0).
DEFAULT_THREADS = torch.get_num_threads()


class LlmEngine:
    """A causal LM with prefill / evict / decode steps for time-budgeted generation."""

    def __init__(self, engine_config: EngineConfig, eviction_config: EvictionConfig,
                 model=None, tokenizer=None, clock: Callable[[], float] = time.perf_counter,
                 step_blocks=None, prefix_cache: Optional[PrefixCacheConfig] = None,
                 transformers_model: bool = False):
        """Use ``model`` and ``tokenizer``, loading from ``engine_config`` those left None.

        clock: seconds (monotonic) for the prefill_s / decode_s this engine reports.
        step_blocks: ``decode_weights: gguf``'s blocks, ``{module name: (type id, blocks)}``
        (engine/gguf_weights.py), for a ``model`` given here whose weights they are; None
        reads them from the embedded GGUF.
        prefix_cache: the prefix store's settings (engine/prefix_store.py); None or not
        enabled: no store, every prefill computes the whole prompt.
        transformers_model: load the embedded model as transformers modules (``self.model``)
        even where it would be served from its GGUF (model_source.gguf_to_serve): what the
        offline tools that train on those modules ask for.
        """
        if not isinstance(engine_config, EngineConfig):
            raise TypeError(f'engine_config must be an EngineConfig, got {engine_config!r}')
        if not isinstance(eviction_config, EvictionConfig):
            raise TypeError(
                f'eviction_config must be an EvictionConfig, got {eviction_config!r}')
        self.eviction_config = eviction_config
        self.scorer = make_scorer(eviction_config)
        self.clock = clock
        loaded = load_model(engine_config, model, tokenizer, step_blocks, transformers_model)
        # engine_config with ``auto`` resolved; model: None for a GGUF on its own blocks;
        # gguf_file: the GGUF served on its own blocks, else None; step_format_probe: s/step
        # of each format decode_weights auto timed; gguf_skipped: why auto did not time gguf.
        self.engine_config = loaded.engine_config
        self.forward, self.model, self.tokenizer = loaded.forward, loaded.model, loaded.tokenizer
        self.vocab_size, self._eos_token_ids = loaded.vocab_size, loaded.eos_token_ids
        self.gguf_file, self.gguf_skipped = loaded.gguf_file, loaded.gguf_skipped
        self.step_format_probe = loaded.step_format_probe
        # Forward passes run so far (prefill chunks and decoding steps): shows that the
        # model never ran for a goal, whatever forward is in use.
        self.n_forward_passes = 0
        self._schemas = None
        self.prefix_store = None
        if prefix_cache is not None and prefix_cache.enabled:
            self.prefix_store = PrefixStore(
                prefix_cache.block_tokens, prefix_cache.max_bytes, prefix_cache.min_tokens,
                fresh_tokens=eviction_config.window_size + 1)
        # Decoder layers (1-based) whose outputs each prefill pools into PrefillState.pooled:
        # the last by default; the server sets those its length readout was trained on.
        self._pool_layers = (self.n_layers,)

    def twin(self, engine_config: EngineConfig) -> 'LlmEngine':
        """Return a second engine on this one's weights, for another thread of the same device.

        The model, its blocks, the tokenizer and the prefix store (it has its own lock) are
        held once; the twin has its own forward pass state, eviction scorer, counters and
        ``engine_config.threads``. What the offload executor uses when it runs on the
        primary's device: a second load held a second copy of the weights (~650 MB for the
        embedded model) and a second store, which admission (on the primary's store) did not
        see. ValueError when ``engine_config`` differs from this engine's in more than
        ``threads``; NotImplementedError for a forward that cannot share (transformers'
        modules).
        """
        changed = [field.name for field in dataclasses.fields(EngineConfig)
                   if field.name != 'threads'
                   and getattr(engine_config, field.name) != getattr(self.engine_config,
                                                                     field.name)]
        if changed:
            raise ValueError(f'a twin engine differs only in threads; {", ".join(changed)} '
                             'differ: load an engine of its own')
        twin_forward = self.forward.twin()  # NotImplementedError before anything is copied
        twin = copy.copy(self)
        twin.engine_config, twin.forward = engine_config, twin_forward
        twin.scorer = make_scorer(self.eviction_config)
        twin.step_format_probe = dict(self.step_format_probe)
        twin.n_forward_passes, twin._schemas = 0, None
        return twin

    def bind_thread(self) -> None:
        """Make torch ops started from the calling thread use ``engine.threads`` threads.

        torch's intra-op thread count is per calling thread (a thread starts from the
        process default, which is torch's own at import unless changed by the main thread),
        so each executor thread binds its engine's count: two engines in one process can
        then split the cores (the offload executor). 0 = the process default.
        """
        torch.set_num_threads(self.engine_config.threads or DEFAULT_THREADS)

    @classmethod
    def load(cls, engine_config: EngineConfig, eviction_config: EvictionConfig,
             prefix_cache: Optional[PrefixCacheConfig] = None,
             transformers_model: bool = False) -> 'LlmEngine':
        """Resolve, load and return the engine of ``engine_config`` (no network).

        This is the server's and the CLI's path: it also turns off transformers' per-weight
        progress bar, which otherwise floods server logs (a process-wide setting).
        prefix_cache: the prefix store's settings (None: no store). transformers_model: as
        in ``__init__``.
        """
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
        return cls(engine_config, eviction_config, prefix_cache=prefix_cache,
                   transformers_model=transformers_model)

    @property
    def schemas(self):
        """The JSON-schema compiler of this engine's tokenizer (engine/grammar.py), made once."""
        if self._schemas is None:
            from timebill_ros.engine.grammar import SchemaCompiler
            self._schemas = SchemaCompiler(self.tokenizer, self.vocab_size)
        return self._schemas

    @property
    def pool_layers(self) -> tuple:
        """Decoder layers (1-based) each prefill pools (what the length readout reads)."""
        return self._pool_layers

    @pool_layers.setter
    def pool_layers(self, layers) -> None:
        layers = tuple(layers)
        if layers != self._pool_layers and self.prefix_store is not None:
            self.prefix_store.clear()  # its blocks' pooled sums are of the old layers
        self._pool_layers = layers

    @property
    def context_tokens(self) -> int:
        """Most positions the model handles (prompt + answer), tokens."""
        return self.forward.context_tokens

    @property
    def eos_token_ids(self) -> tuple:
        """Token ids that end an answer: config/tokenizer EOS and end-of-turn tokens."""
        return self._eos_token_ids

    @property
    def model_key(self) -> str:
        """Short model id (e.g. ``smollm2-135m-instruct``), keys calibration files."""
        return model_source.model_key(self.engine_config)

    @property
    def n_layers(self) -> int:
        """Decoder layers of the model (the granularity of interrupts)."""
        return self.forward.n_layers

    @property
    def device(self) -> torch.device:
        """The model's torch device."""
        return self.forward.device

    def synchronize(self) -> None:
        """Wait until the device has run the work queued so far (CUDA); nothing on the CPU.

        Every clock read that times this engine's work calls it first (engine.forward's
        one ``synchronize`` helper): on a GPU a pass returns once its kernels are queued, so
        a read without it would time their launches, not their work.
        """
        self.forward.synchronize()

    def encode(self, prompt: str, system_prompt: str = '', messages=()) -> list:
        """Return the token ids of the chat-formatted prompt, ready for generation.

        The conversation is ``system_prompt`` (a system turn, when not empty), then
        ``messages`` (``(role, content)`` pairs: an earlier conversation), then ``prompt``
        (a user turn, when not empty). The chat template is applied with
        ``add_generation_prompt=True``. Without a system turn SmolLM2's template inserts its
        default one ("You are a helpful AI assistant named SmolLM, trained by Hugging Face").
        A tokenizer without a chat template (a base model's GGUF) gets the contents joined by
        blank lines, as plain text.
        """
        return encode_chat(self.tokenizer, prompt, system_prompt, messages)

    def match_prefix(self, input_ids, count: bool = True) -> PrefixMatch:
        """Return the head of ``input_ids`` the prefix store holds (an empty match without one).

        count: add the lookup to the store's hit rate (False when re-checking a goal).
        """
        if self.prefix_store is None:
            return PrefixMatch()
        return self.prefix_store.match(input_ids, count)

    def prefill(self, input_ids: list, stop: StopCriteria,
                chunk_plan: Optional[Callable[[int, int], int]] = None,
                interrupt: Optional[StopCriteria] = None,
                prefix: Optional[PrefixMatch] = None,
                store: Optional[PrefixStore] = None) -> PrefillState:
        """Run the prompt through the model in chunks; evict nothing.

        chunk_plan(n_prefilled, n_x) -> tokens of the next chunk (default: fixed chunks of
        ``prefill_chunk_tokens``). ``stop.check(0, None, n_prefilled)`` runs before each chunk;
        ``interrupt`` (include it in ``stop`` too) is checked before every decoder layer.
        A stop reason raises :class:`GenerationStopped`.
        prefix: a :meth:`match_prefix` of these ids: its KV is copied and the prefill starts
        after it (``prefill_s`` includes the copy). store: a PrefixStore (the engine's own,
        ``prefix_store``, for goals) that afterwards keeps the prompt's blocks it lacks
        (before any eviction; the copy is in ``prefill_s``).
        """
        ids = _checked_ids(input_ids, self.vocab_size, self.context_tokens)
        plan = chunk_plan or fixed_chunks(self.engine_config.prefill_chunk_tokens)
        window = self.eviction_config.window_size
        self.synchronize()  # the work queued before is not this prefill's
        start = self.clock()
        cache = self.forward.new_cache()
        pool = HiddenPool(self.forward.norm_eps, self.pool_layers,
                          store.block_tokens if store is not None else 0)
        begin = load_prefix(self.forward, ids, prefix, cache, pool, self.pool_layers)
        n_cached, sizes = begin, _chunk_sizes(plan, begin, len(ids))
        by_layer = len(sizes) > 1 and hasattr(self.forward, 'run_by_layer')
        if by_layer:  # ``stop`` too is checked before each layer of each chunk
            interrupt = _merged(stop, interrupt)
        hooks = PassHooks(interrupt, window + 1, pool, self.forward.layer_wait())
        with torch.inference_mode(), self.forward.hooked(hooks):
            try:
                if by_layer:
                    self.n_forward_passes += len(sizes)
                    logits = self.forward.run_by_layer(ids[begin:], begin, cache, sizes)
                else:
                    logits = self._prefill_chunks(ids, begin, cache, sizes, stop, hooks)
            except Interrupted as exc:
                raise GenerationStopped(exc.reason) from None
        first = int(logits.argmax())
        if store is not None:
            keep_prefix(self.forward, store, ids, cache, pool, hooks.interrupt)
        pooled = pool.features()
        self.synchronize()
        return PrefillState(cache, len(ids), first, hooks.inputs, self.clock() - start,
                            len(sizes), pooled, n_cached, logits)

    def _prefill_chunks(self, ids, begin, cache, sizes, stop, hooks) -> torch.Tensor:
        """Run the chunks one after another, each through every layer; the last logits."""
        for size in sizes:
            reason = stop.check(0, None, begin)
            if reason is not None:
                raise GenerationStopped(reason)
            hooks.n_prefilled = begin
            logits = self._forward(ids[begin:begin + size], begin, cache, step=False)
            begin += size
        return logits

    def pin_prefix(self, system_prompt: str) -> int:
        """Prefill the templated head of ``system_prompt`` and pin it in the store.

        The head is what every goal sent with this system prompt starts with (the common
        token prefix of two such goals). Returns the tokens pinned (whole blocks), 0 without
        a store or when the head is shorter than a block.
        """
        if self.prefix_store is None:
            return 0
        first, second = (self.encode(text, system_prompt) for text in ('a', 'b'))
        n_head = next(i for i, (x, y) in enumerate(zip(first, second)) if x != y)
        head = first[:n_head]
        if n_head < self.prefix_store.block_tokens:
            return 0
        self.prefill(head, StopCriteria(), store=self.prefix_store)
        self.prefix_store.insert(head, lambda index: None, pin=True)  # pins what it holds
        return self.prefix_store.held_tokens(head)

    def evict(self, state: PrefillState, alpha: float,
              interrupt: Optional[StopCriteria] = None, keep_inputs: bool = False) -> int:
        """Evict prompt KV until round(alpha N_x) prompt tokens are gone; return tokens kept.

        Per layer and KV head, at least ``window_size`` prompt tokens (the observation
        window, always kept) and at most those still cached are kept, in their original
        order; the answer's tokens are always kept. alpha no more than what is evicted
        already evicts nothing. After :meth:`prefill`, and also during decoding (a
        checkpoint of timebill-online): the first eviction scores the prompt with the
        captured scorer inputs; a later one keeps the best of those scores. Releases the
        scorer inputs unless ``keep_inputs`` (a later, first eviction during decoding needs
        them). ``interrupt`` is checked before each layer; a stop reason raises
        :class:`GenerationStopped` and leaves the cache partly evicted (discard it).
        Returns the tokens now cached per layer.
        """
        n_keep = n_keep_for(state.n_x, alpha, self.eviction_config.window_size)
        if n_keep >= state.n_prompt_kv:
            if not keep_inputs:
                state.scorer_inputs = None
            return state.n_kv
        inputs, state.scorer_inputs = state.scorer_inputs, None
        scores = state.prompt_scores
        if scores is None and inputs is None:
            raise RuntimeError('evict() needs the scorer inputs of the prefill (released by '
                               'an earlier evict(keep_inputs=False) or a join)')
        state.prompt_scores = scores = {} if scores is None else scores
        with torch.inference_mode():
            for layer_idx in range(self.n_layers):
                reason = None if interrupt is None else interrupt.check(0, None)
                if reason is not None:
                    raise GenerationStopped(reason)
                self._evict_layer(state, layer_idx,
                                  None if inputs is None else inputs[layer_idx], n_keep)
        state.n_prompt_kv = n_keep
        return state.n_kv

    def decode(self, state: PrefillState, n_max: int, stop: StopCriteria,
               on_tokens: Optional[Callable[[int, str], None]] = None,
               feedback_every: int = 4,
               interrupt: Optional[StopCriteria] = None, sampler=None,
               checkpoint=None) -> DecodeResult:
        """Generate greedily after the prompt; return the answer.

        Token 1 is ``state.first_token``. ``stop.check(n_generated, last_token_id)`` runs
        before each step; ``n_max`` tokens (and the model's context) also stop generation,
        with MAX_TOKENS. ``interrupt`` (include it in ``stop`` too) is checked before every
        decoder layer: a stop there abandons the step in flight and returns the tokens so
        far. ``on_tokens(n_generated, new_text)`` gets the text produced since its previous
        call every ``feedback_every`` tokens, and once more at the end if text is left.
        sampler: an engine.sampling.Sampler choosing each token (None: greedy).
        checkpoint: see :meth:`DecodeBatch.join` (None: the cache stays as it is).
        """
        batch = DecodeBatch(self)
        batch.join(state, n_max, stop, on_tokens, feedback_every, interrupt, sampler,
                   checkpoint)
        while True:
            finished = batch.step()
            if finished:
                return finished[0][1]

    def new_batch(self) -> 'DecodeBatch':
        """Return an empty :class:`DecodeBatch` on this engine (goals join between steps)."""
        return DecodeBatch(self)

    def layer_kv(self, state: PrefillState, layer_idx: int):
        """Return layer ``layer_idx``'s live keys and values of ``state``, each (1, H, N, D)."""
        return self.forward.layer_kv(state.cache, layer_idx)

    def _forward(self, token_ids: list, position: int, cache, step: bool) -> torch.Tensor:
        """Run ``token_ids`` at positions ``position``...; return the last logits, (vocab,)."""
        self.n_forward_passes += 1
        return self.forward.run(token_ids, position, cache, step)

    def _evict_layer(self, state, layer_idx: int, inputs, n_keep: int) -> None:
        """Keep the best ``n_keep`` prompt positions of one layer per KV head, and the answer.

        The prompt's scores are computed from ``inputs`` the first time (the scorer sees only
        the prompt's KV) and kept, gathered, in ``state.prompt_scores`` for a later eviction.
        """
        cache, n_prompt = state.cache, state.n_prompt_kv
        keys, values = self.forward.layer_kv(cache, layer_idx)
        scores = state.prompt_scores.get(layer_idx)
        if scores is None:
            scores = windowed(self.scorer.score(
                inputs.module, inputs.hidden_states, keys[:, :, :n_prompt],
                values[:, :, :n_prompt], inputs.kwargs, n_keep=n_keep),
                self.eviction_config.window_size)
        keep = keep_indices(scores, n_keep, 0)
        state.prompt_scores[layer_idx] = scores.gather(-1, keep)
        n_answer = keys.shape[2] - n_prompt
        if n_answer:
            answer = torch.arange(n_prompt, n_prompt + n_answer, device=keep.device)
            keep = torch.cat([keep, answer.expand(*keep.shape[:2], -1)], dim=-1)
        self.forward.keep(cache, layer_idx, keep)

    def random_ids(self, n_tokens: int) -> list:
        """Return ``n_tokens`` reproducible random ids, no special token."""
        return random_ids(self.tokenizer, self.vocab_size, n_tokens)
