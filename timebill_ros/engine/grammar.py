"""JSON-schema constrained decoding (xgrammar's token mask).

Each token is drawn from those that keep the answer a prefix of a document valid against
the goal's schema.

Why xgrammar: on this CPU its mask costs 0.20 ms a step (median, p99 0.31 ms) on a planner
schema with SmolLM2's 49k-token vocabulary, 2-3 % of a decoding step, and compiling a schema
takes ~7 ms (benchmarks/results/grammar_mask.md); llguidance 1.9.1, the other maintained
library, rejected SmolLM2's byte-level tokens (``'Ġ"'``) through its transformers import.
The document is laid out on one line with ``json.dumps``' separators (free whitespace would
let a model pad without end). Once it is complete the mask allows only the end-of-turn
token, so the answer ends with ``eos``.

A schema is a planner's input, so its compile is bounded (issue 58): nesting deeper than
``MAX_SCHEMA_DEPTH`` is refused before compiling, and a compile runs on a thread of its own
(xgrammar releases the GIL; one compile at a time per compiler, no thread kept between
compiles), waited for at most the caller's limit; one that takes longer is refused and its
grammar, when it is done, cached for the next goal with that schema. Never imports rclpy.
"""

import collections
import concurrent.futures
import json
import threading
import time
from typing import Optional

# Nesting levels of JSON (objects and arrays) a schema may have: an object property is two
# (its object, the "properties" object). xgrammar's compile grows steeply with depth: 9 / 22 /
# 385 / 1164 ms at 33 / 65 / 129 / 257 levels (16-128 nested objects) on the 2-core VM
# (2026-11-28); a robot's tool or plan schema has about ten.
MAX_SCHEMA_DEPTH = 64


class SchemaCompiler:
    """Compiles JSON schemas for one tokenizer; keeps the last ``cache_size`` compiled."""

    def __init__(self, tokenizer, vocab_size: int, cache_size: int = 64):
        """Use ``tokenizer`` (transformers) whose model has ``vocab_size`` logits."""
        import xgrammar
        self._xgr = xgrammar
        self.vocab_size = vocab_size
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self._compiler = xgrammar.GrammarCompiler(info)
        self._tokenizer = tokenizer
        self._closer_bonus = None  # (vocab,) float tensor, built on first use
        self._cache = collections.OrderedDict()  # schema text -> compiled grammar
        self._refused = collections.OrderedDict()  # schema text -> why xgrammar refused it
        self._late = {}  # schema text -> the refusal of a compile still running
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._slot = threading.BoundedSemaphore(1)  # one compile at a time

    def compile(self, schema_text: str, timeout_s: Optional[float] = None):
        """Return the compiled grammar of ``schema_text``; ValueError says why it is refused.

        timeout_s: the longest to wait for the compile, seconds (None: as long as it takes);
        a compile that takes longer is refused ("too complex"), goes on on the compiler's
        thread and is cached when done (the same schema meanwhile is refused at once).
        Schemas nested deeper than ``MAX_SCHEMA_DEPTH`` are refused before compiling ("too
        deep"); one xgrammar refused is refused again at once.
        """
        if not isinstance(schema_text, str) or not schema_text.strip():
            raise ValueError('json_schema must be a non-empty JSON schema text')
        with self._lock:
            if schema_text in self._cache:
                self._cache.move_to_end(schema_text)
                return self._cache[schema_text]
            why = self._refused.get(schema_text) or self._late.get(schema_text)
        if why is not None:
            raise ValueError(why)
        try:
            schema = json.loads(schema_text)
        except json.JSONDecodeError as exc:
            raise ValueError(f'json_schema is not JSON: {exc}') from None
        except RecursionError:
            raise ValueError('json_schema too deep: its nesting exceeds the JSON parser\'s '
                             f'limit (at most {MAX_SCHEMA_DEPTH} levels)') from None
        if not isinstance(schema, dict):
            raise ValueError(f'json_schema must be a JSON object, got {type(schema).__name__}')
        depth = nesting_depth(schema)
        if depth > MAX_SCHEMA_DEPTH:
            raise ValueError(f'json_schema too deep: {depth} levels of nesting, at most '
                             f'{MAX_SCHEMA_DEPTH}')
        start = time.monotonic()
        too_complex = (f'json_schema too complex: compile exceeded {timeout_s or 0:.2f} s (or '
                       'waited for another schema\'s)')
        if not self._slot.acquire(timeout=-1 if timeout_s is None else timeout_s):
            raise ValueError(too_complex)
        future = concurrent.futures.Future()
        threading.Thread(target=self._compile_into, args=(schema_text, future),
                         name='timebill-schema', daemon=True).start()
        left_s = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - start))
        try:
            return future.result(timeout=left_s)
        except concurrent.futures.TimeoutError:
            with self._lock:  # unless the compile ended meanwhile (cached or refused)
                if schema_text not in self._cache and schema_text not in self._refused:
                    self._late[schema_text] = too_complex + '; still compiling'
            raise ValueError(too_complex) from None

    def _compile_into(self, schema_text: str, future) -> None:
        """Compile ``schema_text`` into ``future`` (the compile's thread), then free the slot."""
        try:
            future.set_result(self._compile_now(schema_text))
        except BaseException as exc:  # the waiting goal gets it (ValueError: refused)
            future.set_exception(exc)
        finally:
            self._slot.release()

    def _compile_now(self, schema_text: str):
        """Compile ``schema_text`` (the compiler's thread) and cache it; ValueError if bad."""
        try:
            # One line, json.dumps' separators: free whitespace lets a model pad forever.
            compiled = self._compiler.compile_json_schema(schema_text, any_whitespace=False)
        except Exception as exc:  # xgrammar raises its own errors for unsupported schemas
            why = f'json_schema cannot be compiled: {exc}'
            with self._lock:
                self._late.pop(schema_text, None)
                _bounded_put(self._refused, schema_text, why, self._cache_size)
            raise ValueError(why) from None
        with self._lock:
            self._late.pop(schema_text, None)
            _bounded_put(self._cache, schema_text, compiled, self._cache_size)
        return compiled

    def constrain(self, compiled, sampler=None, close_after=None,
                  loop_guard=None) -> 'SchemaSampler':
        """Return a per-goal :class:`SchemaSampler` over ``compiled`` (``sampler``: inner).

        close_after: picks after which it closes the document as fast as it can (None:
        never); loop_guard: a stopping.LoopGuard whose firing starts the closing too.
        """
        return SchemaSampler(self._xgr, compiled, self.vocab_size, sampler, close_after,
                             loop_guard, self.closer_bonus() if (close_after is not None
                                                                 or loop_guard) else None)

    def closer_bonus(self):
        """Return the (vocab,) bonus of tokens that close JSON (:func:`closing_score`).

        Added to the allowed logits while a document closes, so the schema's mask picks the
        token that ends a string, an object or an array before one that goes on.
        """
        import torch
        with self._lock:
            if self._closer_bonus is None:
                bonus = torch.zeros(self.vocab_size)
                pieces = self._tokenizer.convert_ids_to_tokens(
                    list(range(min(self.vocab_size, len(self._tokenizer)))))
                for token_id, piece in enumerate(pieces):
                    bonus[token_id] = CLOSE_BONUS * max(0.0, closing_score(piece or ''))
                self._closer_bonus = bonus
            return self._closer_bonus


def _bounded_put(cache: collections.OrderedDict, key, value, size: int) -> None:
    """Put ``key`` last in ``cache``, dropping the oldest entries beyond ``size``."""
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > size:
        cache.popitem(last=False)


def nesting_depth(value) -> int:
    """Return the nesting levels of objects and arrays in parsed JSON ``value`` (0: scalar).

    Iterative: a schema is a planner's input and may be nested as deep as the parser took.
    """
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = (item.values() if isinstance(item, dict)
                    else item if isinstance(item, list) else None)
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


class SchemaSampler:
    """Picks a goal's tokens under its schema's mask, then with ``sampler`` (None: greedy).

    Closing: after ``close_after`` picks, or once ``loop_guard`` fires (the answer repeats a
    cycle, inside a string say), the allowed tokens that close a string, an object or an array
    get ``closer_bonus`` added, so the document ends within a few tokens instead of running
    to max_new_tokens cut (``closing`` says since when).
    """

    def __init__(self, xgrammar, compiled, vocab_size: int, sampler: Optional[object] = None,
                 close_after: Optional[int] = None, loop_guard=None, closer_bonus=None):
        self._xgr = xgrammar
        self.matcher = xgrammar.GrammarMatcher(compiled)
        self.bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
        self.sampler = sampler
        self.close_after, self.loop_guard = close_after, loop_guard
        self.closer_bonus = closer_bonus
        self.n_picked = 0
        self.closing = None  # the pick at which closing began, None while not closing

    def __call__(self, logits):
        """Return the next token id from ``logits`` (vocab,) among those the schema allows."""
        self.matcher.fill_next_token_bitmask(self.bitmask)
        masked = logits.detach().float().cpu().clone().unsqueeze(0)
        self._xgr.apply_token_bitmask_inplace(masked, self.bitmask)
        if self.closing is not None:
            masked[0] += self.closer_bonus  # disallowed tokens stay at -inf
        token = int(masked[0].argmax()) if self.sampler is None else self.sampler(masked[0])
        self.matcher.accept_token(token)
        self.n_picked += 1
        if self.closing is None and self._must_close(token):
            self.closing = self.n_picked
        return token

    def _must_close(self, token) -> bool:
        if self.close_after is not None and self.n_picked >= self.close_after:
            return True
        return (self.loop_guard is not None
                and self.loop_guard.should_stop(self.n_picked, token) is not None)

    @property
    def complete(self) -> bool:
        """True once the answer is a whole document (only the end token may follow)."""
        return self.matcher.is_terminated()


# Logit bonus a unit of closing_score gives while a document closes: above any model logit.
CLOSE_BONUS = 1.0e4
# Characters that end something in JSON (a string: '"' first, since '}' is string content
# too) and those that open or continue something.
CLOSING_CHARS = {'"': 2.0, '}': 1.5, ']': 1.5}
OPENING_CHARS = {',': -2.0, ':': -2.0, '{': -2.0, '[': -2.0}


def closing_score(piece: str) -> float:
    """Return how much a token's text closes JSON: '"' 2, '}' ']' 1.5, ',' ':' '{' '[' -2.

    Inside a string the closing quote wins over a '}' of content; after a value, '}' or ']'
    wins over ',"' (a new key or item). Only tokens the schema allows are ever picked.
    """
    weights = {**CLOSING_CHARS, **OPENING_CHARS}
    return sum(weights.get(char, 0.0) for char in piece)


# A schema answer starts closing this many tokens before max_new_tokens (a quarter of a
# smaller N_max): enough to end a string and the objects and arrays around it.
CLOSE_RESERVE_TOKENS = 32

# The start-up probe of the mask's cost: a planner-like schema and a document valid for it.
PROBE_SCHEMA = json.dumps({
    'type': 'object', 'additionalProperties': False, 'required': ['action', 'target', 'steps'],
    'properties': {
        'action': {'enum': ['move', 'pick', 'place', 'wait']}, 'target': {'type': 'string'},
        'speed': {'type': 'number'},
        'steps': {'type': 'array', 'items': {
            'type': 'object', 'required': ['x', 'y'],
            'properties': {'x': {'type': 'number'}, 'y': {'type': 'number'}}}}}})
PROBE_DOCUMENT = json.dumps({'action': 'move', 'target': 'dock 3', 'speed': 0.5,
                             'steps': [{'x': i * 1.5, 'y': 2.0 - i} for i in range(8)]})


def measure_mask_step_s(engine) -> float:
    """Return the median seconds the mask adds to a step (PROBE_SCHEMA over PROBE_DOCUMENT)."""
    import statistics
    import time

    import torch
    schemas = engine.schemas
    ids = engine.tokenizer(PROBE_DOCUMENT, add_special_tokens=False)['input_ids']
    picker = schemas.constrain(schemas.compile(PROBE_SCHEMA))
    logits = torch.zeros(schemas.vocab_size)
    times = []
    for token in ids:
        logits.zero_()
        logits[token] = 1.0  # the document's own token is the argmax
        start = time.perf_counter()
        picker(logits)
        times.append(time.perf_counter() - start)
    return statistics.median(times)
