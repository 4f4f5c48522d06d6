"""JSON-schema constrained decoding (xgrammar's token mask).

Each token is drawn from those that keep the answer a prefix of a document valid against
the goal's schema.

Why xgrammar: on this CPU its mask costs 0.20 ms a step (median, p99 0.31 ms) on a planner
schema with SmolLM2's 49k-token vocabulary, 2-3 % of a decoding step, and compiling a schema
takes ~7 ms (benchmarks/results/grammar_mask.md); llguidance 1.9.1, the other maintained
library, rejected SmolLM2's byte-level tokens (``'Ġ"'``) through its transformers import.
The document is laid out on one line with ``json.dumps``' separators (free whitespace would
let a model pad without end). Once it is complete the mask allows only the end-of-turn
token, so the answer ends with ``eos``. Never imports rclpy.
"""

import collections
import json
import threading
from typing import Optional


class SchemaCompiler:
    """Compiles JSON schemas for one tokenizer; keeps the last ``cache_size`` compiled."""

    def __init__(self, tokenizer, vocab_size: int, cache_size: int = 64):
        """Use ``tokenizer`` (transformers) whose model has ``vocab_size`` logits."""
        import xgrammar
        self._xgr = xgrammar
        self.vocab_size = vocab_size
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self._compiler = xgrammar.GrammarCompiler(info)
        self._cache = collections.OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def compile(self, schema_text: str):
        """Return the compiled grammar of ``schema_text``; ValueError says why it is bad."""
        if not isinstance(schema_text, str) or not schema_text.strip():
            raise ValueError('json_schema must be a non-empty JSON schema text')
        with self._lock:
            if schema_text in self._cache:
                self._cache.move_to_end(schema_text)
                return self._cache[schema_text]
        try:
            schema = json.loads(schema_text)
        except json.JSONDecodeError as exc:
            raise ValueError(f'json_schema is not JSON: {exc}') from None
        if not isinstance(schema, dict):
            raise ValueError(f'json_schema must be a JSON object, got {type(schema).__name__}')
        try:
            # One line, json.dumps' separators: free whitespace lets a model pad forever.
            compiled = self._compiler.compile_json_schema(schema_text, any_whitespace=False)
        except Exception as exc:  # xgrammar raises its own errors for unsupported schemas
            raise ValueError(f'json_schema cannot be compiled: {exc}') from None
        with self._lock:
            self._cache[schema_text] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def constrain(self, compiled, sampler=None) -> 'SchemaSampler':
        """Return a per-goal :class:`SchemaSampler` over ``compiled`` (``sampler``: inner)."""
        return SchemaSampler(self._xgr, compiled, self.vocab_size, sampler)


class SchemaSampler:
    """Picks a goal's tokens under its schema's mask, then with ``sampler`` (None: greedy)."""

    def __init__(self, xgrammar, compiled, vocab_size: int, sampler: Optional[object] = None):
        self._xgr = xgrammar
        self.matcher = xgrammar.GrammarMatcher(compiled)
        self.bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
        self.sampler = sampler

    def __call__(self, logits):
        """Return the next token id from ``logits`` (vocab,) among those the schema allows."""
        self.matcher.fill_next_token_bitmask(self.bitmask)
        masked = logits.detach().float().cpu().clone().unsqueeze(0)
        self._xgr.apply_token_bitmask_inplace(masked, self.bitmask)
        token = int(masked[0].argmax()) if self.sampler is None else self.sampler(masked[0])
        self.matcher.accept_token(token)
        return token

    @property
    def complete(self) -> bool:
        """True once the answer is a whole document (only the end token may follow)."""
        return self.matcher.is_terminated()


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
