"""Decoding B goals step by step, each with its own cache, position and stop criteria.

Goals join between steps (after their own prefill and eviction) and leave as soon as one of
their criteria fires (EOS, N_max, cancel, Kill); the others go on. One step runs all rows
through the forward pass together (:meth:`Forward.run_step`); with one row it is exactly the
single-goal decoding loop, which ``LlmEngine.decode`` runs on.
"""

import dataclasses
from typing import Callable, Optional

import torch

from timebill_ros.engine.forward import PassHooks
from timebill_ros.engine.stopping import (
    EOS, MAX_TOKENS, REPETITION, STOP_STRING, StopCriteria)


@dataclasses.dataclass
class DecodeResult:
    """Result of :meth:`LlmEngine.decode`.

    token_ids: generated tokens, the EOS that stopped generation excluded (a stop string's or
    a loop's tail too). text: their text (cut before a stop string). stop_reason: EOS,
    MAX_TOKENS, STOP_STRING, REPETITION, CANCELED, DEADLINE or CANNOT_FINISH. decode_s: wall
    seconds of decode() (the device synchronized at both ends).
    n_kv_final: tokens held in the cache per layer at the end.
    """

    token_ids: list
    text: str
    stop_reason: str
    decode_s: float
    n_kv_final: int


class _TextStream:
    """Incremental detokenizer for feedback: sends only text that is complete."""

    def __init__(self, tokenizer, callback, every: int):
        """Call ``callback(n_generated, new_text)`` every ``every`` tokens."""
        self.tokenizer = tokenizer
        self.callback = callback
        self.every = every
        self.sent = ''

    def text(self, tokens) -> str:
        """Return the text of ``tokens``, special tokens skipped, spaces untouched."""
        # No space clean-up: it could rewrite text already sent.
        return self.tokenizer.decode(tokens, skip_special_tokens=True,
                                     clean_up_tokenization_spaces=False)

    def after_token(self, tokens) -> None:
        """Send the new text when len(tokens) is a multiple of ``every``."""
        if self.callback is None or len(tokens) % self.every:
            return
        text = self.text(tokens)
        if not text.endswith('\ufffd'):  # else wait for the rest of a multi-byte character
            self._send(len(tokens), text)

    def finish(self, tokens) -> str:
        """Send any text not sent yet; return the full text."""
        text = self.text(tokens)
        if self.callback is not None and text != self.sent:
            self._send(len(tokens), text)
        return text

    def _send(self, n_generated, text):
        new_text, self.sent = text[len(self.sent):], text
        self.callback(n_generated, new_text)


@dataclasses.dataclass
class _Row:
    state: object
    limit: int
    stop: StopCriteria
    stream: _TextStream
    hooks: PassHooks
    start_s: float
    tokens: list
    sampler: Optional[Callable] = None
    checkpoint: Optional[Callable[[int], Optional[str]]] = None


class DecodeBatch:
    """Goals decoding together on one engine; see the module docstring. Not thread-safe."""

    def __init__(self, engine):
        """Decode on ``engine`` (an LlmEngine)."""
        self.engine = engine
        self._rows = {}
        self._next_id = 0

    def __len__(self) -> int:
        """Goals decoding now."""
        return len(self._rows)

    def join(self, state, n_max: int, stop: StopCriteria,
             on_tokens: Optional[Callable[[int, str], None]] = None, feedback_every: int = 4,
             interrupt: Optional[StopCriteria] = None, sampler=None, checkpoint=None) -> int:
        """Add a prefilled (and evicted) goal; return its row id.

        As ``LlmEngine.decode``: token 1 is ``state.first_token``; ``stop`` is checked before
        each step, ``interrupt`` (include it in ``stop`` too) before every decoder layer;
        ``n_max`` tokens and the model's context end it with MAX_TOKENS; ``on_tokens``
        gets new text every ``feedback_every`` tokens and once at the end. sampler
        (engine.sampling.Sampler): picks this goal's tokens, token 1 from the prefill's
        logits too; None: greedy. checkpoint(n_generated) -> stop reason or None: runs
        before each of this goal's steps once ``stop`` let it go on, and may evict more of
        its cache (timebill-online; it keeps the prefill's scorer inputs, which a goal
        without one releases here); a reason ends the goal as ``stop``'s would.
        ``state.answer_pool`` (a HiddenPool of the last layer, or None) pools every step's
        last-layer output of this goal (the GGUF decoders, the lean Llama and transformers').
        """
        for name, value in (('n_max', n_max), ('feedback_every', feedback_every)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f'{name} must be an int >= 1, got {value!r}')
        forward = self.engine.forward
        if len(self._rows) >= forward.max_batch:
            raise ValueError(f'the {forward.name} forward decodes at most {forward.max_batch} '
                             f'goal(s) per step')
        if checkpoint is None:
            state.scorer_inputs = None
        # The last token is never fed: its position may be context_tokens at most.
        limit = min(n_max, self.engine.context_tokens - state.n_x + 1)
        stream = _TextStream(self.engine.tokenizer, on_tokens, feedback_every)
        first = state.first_token
        if sampler is not None and state.logits is not None:
            first = sampler(state.logits)
        hooks = PassHooks(interrupt, wait=self.engine.forward.layer_wait())
        hooks.answer_pool = state.answer_pool
        self.engine.synchronize()  # decode_s starts once the prefill's work is done
        row = _Row(state, limit, stop, stream, hooks, self.engine.clock(), [first], sampler,
                   checkpoint)
        stream.after_token(row.tokens)
        row_id, self._next_id = self._next_id, self._next_id + 1
        self._rows[row_id] = row
        return row_id

    def step(self) -> list:
        """Check every goal, run one step of those still going; return the goals that ended.

        Returns ``[(row_id, DecodeResult)]`` in row order; they have left the batch.
        """
        finished = []
        for row_id, row in list(self._rows.items()):
            reason = row.stop.check(len(row.tokens), row.tokens[-1])
            if reason is None and len(row.tokens) >= row.limit:
                reason = MAX_TOKENS
            if reason is None and row.checkpoint is not None:
                reason = row.checkpoint(len(row.tokens))
            if reason is not None:
                finished.append((row_id, self._finish(row_id, reason)))
        if not self._rows:
            return finished
        ids = list(self._rows)
        rows = [self._rows[i] for i in ids]
        for row in rows:
            row.hooks.n_generated = len(row.tokens)
        self.engine.n_forward_passes += 1
        with torch.inference_mode():
            logits, interrupted = self.engine.forward.run_step(
                [row.tokens[-1] for row in rows],
                [row.state.n_x + len(row.tokens) - 1 for row in rows],
                [row.state.cache for row in rows], [row.hooks for row in rows])
        for index, row in enumerate(rows):
            if index in interrupted:
                finished.append((ids[index], self._finish(ids[index], interrupted[index])))
                continue
            row.tokens.append(int(logits[index].argmax()) if row.sampler is None
                              else row.sampler(logits[index]))
            row.stream.after_token(row.tokens)
        return sorted(finished, key=lambda item: item[0])

    def _finish(self, row_id, reason) -> DecodeResult:
        row = self._rows.pop(row_id)
        tokens = row.tokens
        if reason == EOS:  # EosStop fired on the last token: not part of the answer
            tokens.pop()
        fired = row.stop.fired
        if fired is not None and reason in (STOP_STRING, REPETITION):
            del tokens[fired.answer_tokens(tokens):]  # the stop string's or the loop's tail
        text = row.stream.finish(tokens)
        if reason == STOP_STRING:
            text = fired.cut_text(text) or ''  # the text before the stop string
        self.engine.synchronize()
        return DecodeResult(tokens, text, reason, self.engine.clock() - row.start_s,
                            row.state.n_kv)
