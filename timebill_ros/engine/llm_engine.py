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
import logging
import pathlib
import statistics
import time
from typing import Callable, Optional

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from timebill_ros.checks import check_count
from timebill_ros.config import EngineConfig, EvictionConfig, PrefixCacheConfig
from timebill_ros.engine import kernels, model_source
from timebill_ros.engine.chat import encode_chat
from timebill_ros.engine.decode_batch import DecodeBatch, DecodeResult
from timebill_ros.engine.forward import (Forward, HiddenPool, Interrupted, PassHooks,
                                         avoid_cudnn_attention)
from timebill_ros.engine.hf_forward import TransformersForward
from timebill_ros.engine.lean_llama import LeanLlamaForward, unsupported_reason
from timebill_ros.engine.step_format import choose_step_format, forward_step_s, PROBE_KV
from timebill_ros.engine.eviction import keep_indices, make_scorer, n_keep_for, windowed
from timebill_ros.engine.prefix_store import PrefixMatch, PrefixStore
from timebill_ros.engine.probe import Probe
from timebill_ros.engine.stopping import StepTimer, StopCriteria

DTYPES = {'float32': torch.float32, 'float16': torch.float16, 'bfloat16': torch.bfloat16}
# One-token step weight formats (engine.decode_weights): int8 is weight-only, per output row.
STEP_DTYPES = dict(DTYPES, int8=torch.int8)
# The GGUF file's own blocks through the C++ kernels (engine/gguf_weights.py, engine/kernels).
GGUF_FORMAT = 'gguf'
# Chat templates' end-of-turn tokens; those the tokenizer knows count as EOS.
END_OF_TURN_TOKENS = ('<|im_end|>', '<|eot_id|>', '<|end|>', '<end_of_turn>')
# sdpa works with the hooks: they read the attention *inputs*, never the attention weights.
ATTN_IMPLEMENTATION = 'sdpa'


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
        self.engine_config = engine_config
        self.eviction_config = eviction_config
        # The embedded GGUF, loaded here (not a model a caller built): decode_weights gguf's
        # blocks are its weights.
        self.embedded_model = model is None and not engine_config.model_path
        self.scorer = make_scorer(eviction_config)
        self.clock = clock
        # s/step of each format probed by decode_weights auto; empty when it was named.
        self.step_format_probe = {}
        # Why ``auto`` did not probe ``gguf`` (None when it did or was not asked to choose).
        self.gguf_skipped = None
        # The GGUF file served on its own blocks (engine/gguf): ``engine.model_path: <file>.gguf``
        # or the embedded one on the CPU (model_source.gguf_to_serve); else None.
        self.gguf_file = None
        gguf_path = (model_source.gguf_to_serve(engine_config, transformers_model)
                     if model is None else None)
        if gguf_path is not None:
            self._load_gguf(gguf_path, tokenizer)
        else:
            self._load_transformers(model, tokenizer, step_blocks)
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

    def _load_gguf(self, path, tokenizer) -> None:
        """Serve the GGUF file at ``path`` on its own blocks (engine/models).

        No transformers model is built (``self.model`` stays None); the tokenizer and chat
        template come from the file. ``decode_weights`` becomes ``gguf`` (what every step
        runs) and ``prefill_dtype`` what ``auto`` resolved to. On another device (a GPU) the
        same decoder holds the weights dequantized there in ``engine.dtype`` and decodes on
        static buffers as CUDA graphs (engine/models/static_step.py); ``decode_weights`` then
        names that dtype. The same dense decoder runs on the CPU when ``decode_weights``
        names a dtype (float32, float16, bfloat16): what the GPU runs, without the kernels
        (tests, the GPU check's CPU dry run). The device memory the weights take is logged.
        """
        from timebill_ros.engine.gguf.file import GgufFile
        from timebill_ros.engine.gguf.tokenizer import build_tokenizer
        from timebill_ros.engine.models import load_decoder
        from timebill_ros.engine.models.weights import prefill_dtype
        config = self.engine_config
        if config.threads > 0:
            torch.set_num_threads(config.threads)
        self.gguf_file = GgufFile(path)
        device = torch.device(config.device)
        dense = config.decode_weights in DTYPES  # a dense dtype named (on the CPU too)
        if device.type == 'cpu' and not dense:
            self.forward = load_decoder(self.gguf_file)
            gemm_dtype = prefill_dtype(config.prefill_dtype)
            self.forward.prefill_dtype = getattr(torch, gemm_dtype)
            step_format = GGUF_FORMAT
        else:
            avoid_cudnn_attention(device)  # before any timed pass
            step_format = config.decode_weights if dense else config.dtype
            self.forward = load_decoder(self.gguf_file, device, DTYPES[step_format])
            self.forward.static_steps.max_bytes = int(config.step_buffers_mb * 1e6)
            self.forward.static_steps.warm()  # one-row graphs up to 4k KV, before any timing
            gemm_dtype = config.prefill_dtype
            _log_device_memory(path, device, self.forward.weight_bytes)
        self.model = None
        self.vocab_size = self.forward.vocab_size
        self.tokenizer = tokenizer if tokenizer is not None else build_tokenizer(self.gguf_file)
        self._eos_token_ids = _eos_token_ids(None, self.tokenizer, self.gguf_file)
        self.engine_config = dataclasses.replace(config, decode_weights=step_format,
                                                 prefill_dtype=gemm_dtype)

    def _load_transformers(self, model, tokenizer, step_blocks) -> None:
        """Serve a transformers model (given, a directory, or the converted embedded GGUF)."""
        engine_config = self.engine_config
        if engine_config.prefill_dtype != 'auto':
            raise ValueError(f'engine.prefill_dtype {engine_config.prefill_dtype!r} applies to a '
                             '.gguf model_path; a transformers model prefills in engine.dtype '
                             '(leave prefill_dtype auto)')
        if model is None or tokenizer is None:
            model_dir = model_source.resolve_model_dir(engine_config)
            if tokenizer is None:
                tokenizer = _load_tokenizer(model_dir)
            if model is None:
                model = _load_model(model_dir, engine_config)
        self.model = model.eval()
        self.tokenizer = tokenizer
        # Token ids the model reads and scores.
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self._eos_token_ids = _eos_token_ids(model, tokenizer)
        avoid_cudnn_attention(next(model.parameters()).device)  # before any timed pass
        if engine_config.decode_weights == 'auto' and _lean_chosen(self.model, engine_config):
            self._choose_step_format()
        else:
            self.forward = make_forward(self.model, engine_config, step_blocks)

    def _choose_step_format(self) -> None:
        """Resolve ``decode_weights: auto`` by timing steps (engine/step_format.py).

        ``engine_config`` then names the chosen format, so calibration files key on it.
        """
        def make(name):
            return make_forward(self.model,
                                dataclasses.replace(self.engine_config, decode_weights=name))

        token_ids = self.random_ids(PROBE_KV)
        if self.engine_config.threads > 0:
            torch.set_num_threads(self.engine_config.threads)
        formats = ('float32', 'float16')
        self.gguf_skipped = ('the model was given by the caller' if not self.embedded_model
                             else _gguf_unusable_reason(self.model, self.engine_config))
        if self.gguf_skipped is None:
            formats += (GGUF_FORMAT,)
        with torch.inference_mode():
            chosen, self.forward, self.step_format_probe = choose_step_format(
                make, lambda forward: forward_step_s(forward, token_ids), formats)
        self.engine_config = dataclasses.replace(self.engine_config, decode_weights=chosen)

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
        ids = self._check_ids(input_ids)
        plan = chunk_plan or fixed_chunks(self.engine_config.prefill_chunk_tokens)
        window = self.eviction_config.window_size
        self.synchronize()  # the work queued before is not this prefill's
        start = self.clock()
        cache = self.forward.new_cache()
        pool = HiddenPool(self.forward.norm_eps, self.pool_layers,
                          store.block_tokens if store is not None else 0)
        begin = self._load_prefix(ids, prefix, cache, pool)
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
            self._keep_prefix(store, ids, cache, pool, hooks.interrupt)
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

    def _load_prefix(self, ids, prefix, cache, pool) -> int:
        """Copy ``prefix``'s KV into ``cache`` and seed ``pool``; return its tokens (0: none)."""
        if prefix is None or not prefix.n_tokens:
            return 0
        size = len(prefix.blocks[0].tokens)
        if (prefix.n_tokens >= len(ids) or prefix.n_tokens != size * len(prefix.blocks)
                or any(block.tokens != tuple(ids[i * size:(i + 1) * size])
                       for i, block in enumerate(prefix.blocks))):
            raise ValueError(f'prefix of {prefix.n_tokens} tokens is not a head of these '
                             f'{len(ids)} prompt tokens')
        pooled = prefix.pool_sum()
        if pooled is None or pooled.shape[0] != len(self.pool_layers):
            raise ValueError('prefix was stored for other pooled layers')
        with torch.inference_mode():
            for layer_idx in range(self.n_layers):
                keys = torch.cat([block.kv[layer_idx, 0] for block in prefix.blocks], dim=1)
                values = torch.cat([block.kv[layer_idx, 1] for block in prefix.blocks], dim=1)
                self.forward.append_kv(cache, layer_idx, keys.unsqueeze(0),
                                       values.unsqueeze(0))
        pool.seed(pooled, prefix.n_tokens)
        return prefix.n_tokens

    def _keep_prefix(self, store, ids, cache, pool, interrupt=None) -> None:
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
            return self._block_kv(cache, index * size, (index + 1) * size), pooled

        store.insert(ids, make_block)

    def _block_kv(self, cache, begin: int, end: int) -> torch.Tensor:
        """Return a copy of positions [begin, end) of every layer's KV, (L, 2, H, n, D)."""
        with torch.inference_mode():
            parts = []
            for layer in range(self.n_layers):
                keys, values = self.forward.layer_kv(cache, layer)
                parts += [keys[0, :, begin:end], values[0, :, begin:end]]
            # One stack, not 2 L copies: on a GPU each copy is a kernel launch (a 3k-token
            # prompt's 47 blocks of SmolLM2 were ~2.9k launches).
            stacked = torch.stack(parts)  # (2 L, H, n, D)
            return stacked.view(self.n_layers, 2, *stacked.shape[1:])

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

    def measure_prefill_s(self, n_x: int, repeats: int = 1) -> float:
        """Return the median seconds to prefill ``n_x`` random non-special tokens."""
        check_count('n_x', n_x, maximum=self.context_tokens)
        check_count('repeats', repeats)
        ids = self.random_ids(n_x)
        return statistics.median(
            self.prefill(ids, StopCriteria()).prefill_s for _ in range(repeats))

    def measure_decode_step_s(self, n_kv: int, steps: int = 8) -> float:
        """Return the mean seconds of one decoding step with ``n_kv`` tokens cached.

        The cache is filled by a prefill of ``n_kv`` random tokens (not timed). The steps run
        through :meth:`decode` itself - stop checks, text streaming and a feedback callback
        included - so the estimate covers what the server pays per token, not only the
        model's forward. The cache grows by one token per step.
        """
        check_count('steps', steps)
        check_count('n_kv', n_kv, maximum=self.context_tokens - steps - 1)
        state = self.prefill(self.random_ids(n_kv), StopCriteria())
        out = self.decode(state, steps + 1, StopCriteria(), on_tokens=lambda n, text: None,
                          feedback_every=self.engine_config.feedback_every_tokens)
        # Token 1 comes from the prefill; each further token is one decoding step.
        return out.decode_s / (len(out.token_ids) - 1)

    def measure_batch_step_s(self, batch_size: int, n_kv: int, steps: int = 4) -> float:
        """Return the mean seconds of one decoding step of ``batch_size`` goals together.

        Each goal is a prefill of ``n_kv`` random tokens (not timed); the first step is not
        timed either; then ``steps`` steps of the engine's own batch.
        """
        check_count('batch_size', batch_size, maximum=self.forward.max_batch)
        check_count('steps', steps)
        check_count('n_kv', n_kv, maximum=self.context_tokens - steps - 2)
        batch = self.new_batch()
        for _ in range(batch_size):
            batch.join(self.prefill(self.random_ids(n_kv), StopCriteria()), steps + 2,
                       StopCriteria())
        batch.step()
        self.synchronize()
        start = self.clock()
        for _ in range(steps):
            batch.step()
        self.synchronize()
        return (self.clock() - start) / steps

    def measure_probe(self, n_in: int, n_out: int) -> Probe:
        """Time one generation of exactly ``n_out`` tokens after ``n_in`` random tokens.

        The server's own prefill and decode loop run (stop checks, text streaming and a
        feedback callback included); no KV eviction; EOS does not stop it, so the answer is
        exactly ``n_out`` tokens. Returns the prefill seconds and each decoding step's seconds.
        """
        check_count('n_out', n_out)
        check_count('n_in', n_in, maximum=self.context_tokens - n_out + 1)
        state = self.prefill(self.random_ids(n_in), StopCriteria())
        timer = StepTimer(self.clock, sync=self.synchronize)
        self.decode(state, n_out, StopCriteria([timer]), on_tokens=lambda n, text: None,
                    feedback_every=self.engine_config.feedback_every_tokens)
        return Probe(n_in, n_out, state.prefill_s, tuple(timer.step_durations_s()))

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

    def _check_ids(self, input_ids) -> list:
        """Return ``input_ids`` as a list after checking type, range and length."""
        if not isinstance(input_ids, (list, tuple)) or not input_ids:
            raise TypeError(f'input_ids must be a non-empty list of ints, got {input_ids!r}')
        vocab = self.vocab_size
        bad = [t for t in input_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f'input_ids hold ids outside [0, {vocab}): {bad[:5]!r}')
        if len(input_ids) > self.context_tokens:
            raise ValueError(f'prompt of {len(input_ids)} tokens exceeds the context of '
                             f'{self.context_tokens} tokens')
        return list(input_ids)

    def random_ids(self, n_tokens: int) -> list:
        """Return ``n_tokens`` reproducible random ids, no special token."""
        vocab = self.vocab_size
        allowed = torch.ones(vocab, dtype=torch.bool)
        special = [t for t in self.tokenizer.all_special_ids if 0 <= t < vocab]
        allowed[special] = False
        candidates = allowed.nonzero().squeeze(1)
        generator = torch.Generator().manual_seed(n_tokens)
        picks = torch.randint(len(candidates), (n_tokens,), generator=generator)
        return candidates[picks].tolist()


def _log_device_memory(path, device: torch.device, weight_bytes: int) -> None:
    """Log (stderr) the device memory a GGUF file's dense weights take, MB."""
    allocated = (torch.cuda.memory_allocated(device) if device.type == 'cuda' else 0) / 1e6
    logging.getLogger('timebill_ros.engine').warning(
        '%s on %s: weights %.1f MB, %.1f MB allocated on the device', pathlib.Path(path).name,
        device, weight_bytes / 1e6, allocated)


def _lean_chosen(model, engine_config: EngineConfig) -> bool:
    """Return True when ``engine.forward`` puts ``model`` on the lean forward."""
    if engine_config.forward == 'transformers':
        return False
    return engine_config.forward == 'lean' or unsupported_reason(model) is None


def make_forward(model, engine_config: EngineConfig, step_blocks=None) -> Forward:
    """Return the forward pass ``engine_config.forward`` names for ``model``.

    step_blocks: the GGUF blocks of ``decode_weights: gguf`` (None: the embedded GGUF's).

    ``auto``: the lean forward when the model is Llama-family, else transformers'.
    ``engine.decode_weights`` applies to the lean forward only (``auto`` is resolved by
    LlmEngine before this; here it means the model's dtype).
    """
    if not _lean_chosen(model, engine_config):
        return TransformersForward(model)
    reason = unsupported_reason(model)
    if reason is not None:
        raise ValueError(f'engine.forward is lean, but {reason}')
    if engine_config.decode_weights == GGUF_FORMAT:
        if step_blocks is None:
            step_blocks = _gguf_step_blocks(model, engine_config)
        return LeanLlamaForward(model, None, step_blocks)
    return LeanLlamaForward(model, STEP_DTYPES.get(engine_config.decode_weights))


def _gguf_unusable_reason(model, engine_config: EngineConfig) -> Optional[str]:
    """Return why ``decode_weights: gguf`` cannot run ``model`` here, or None when it can.

    It needs the embedded GGUF model in fp32 on the CPU and the kernels built for this CPU
    (a C++ compiler at the first start; engine/kernels).
    """
    if engine_config.model_path:
        return 'the model is a transformers directory (engine.model_path), not the GGUF'
    if model.dtype != torch.float32 or model.device.type != 'cpu':
        return f'the model runs in {model.dtype} on {model.device}, the kernels in fp32 on a CPU'
    try:
        kernels.load()
    except RuntimeError as exc:
        return str(exc)
    return None


def _gguf_step_blocks(model, engine_config: EngineConfig) -> dict:
    """Return the GGUF step blocks of ``decode_weights: gguf`` (the embedded model only)."""
    from timebill_ros.engine.gguf_weights import read_step_blocks
    if engine_config.model_path:
        raise ValueError('engine.decode_weights gguf reads the embedded GGUF model; '
                         f'engine.model_path is {engine_config.model_path!r}')
    return read_step_blocks(model_source.embedded_gguf_path(), model.config)


def _load_tokenizer(model_dir):
    """Load the tokenizer of ``model_dir`` from disk only."""
    return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


def _load_model(model_dir, engine_config: EngineConfig):
    """Load the causal LM of ``model_dir`` with the config's device, dtype and threads."""
    if engine_config.threads > 0:
        torch.set_num_threads(engine_config.threads)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=DTYPES[engine_config.dtype], attn_implementation=ATTN_IMPLEMENTATION,
        local_files_only=True)
    return model.to(engine_config.device).eval()


def _eos_token_ids(model, tokenizer, gguf_file=None) -> tuple:
    """Return the sorted EOS ids: model/generation config, tokenizer, end-of-turn tokens.

    model: a transformers model, or None for a GGUF file (``gguf_file``: its EOS / EOT ids).
    """
    ids = set()
    if model is not None:
        generation_config = getattr(model, 'generation_config', None)
        values = [getattr(generation_config, 'eos_token_id', None), model.config.eos_token_id]
    else:
        from timebill_ros.engine.gguf.tokenizer import eos_token_ids
        values = eos_token_ids(gguf_file)
    for value in values + [tokenizer.eos_token_id]:
        ids.update([value] if isinstance(value, int) else value or ())
    for token in END_OF_TURN_TOKENS:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            ids.add(token_id)
    return tuple(sorted(ids))
