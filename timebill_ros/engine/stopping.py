"""Per-step stop criteria for generation.

EOS, N_max, cancel, deadline, cannot-finish, stop strings and the loop guard.

The engine calls :meth:`StopCriteria.check` before every prefill chunk (``n_prefilled`` = the
prompt tokens done so far) and before every decoding step; the *interrupt* criteria of a goal
(cancel, the Kill deadline) are also checked before every decoder layer, so a stop lands
within one layer of one forward pass. Clocks are injected (a callable returning monotonic
seconds) so tests are deterministic.
"""

import abc
import threading
import time
from typing import Callable, Iterable, Optional

EOS = 'eos'
MAX_TOKENS = 'max_tokens'
CANCELED = 'canceled'
DEADLINE = 'deadline'
# The time model says the goal can no longer finish before its deadline (early Kill).
CANNOT_FINISH = 'cannot_finish'
STOP_STRING = 'stop'
REPETITION = 'repetition'


class StopCriterion(abc.ABC):
    """Decides whether generation stops now.

    A criterion that ends an answer before its last token (a stop string, a loop) also
    overrides :meth:`answer_tokens`: how many of the generated tokens the answer keeps.
    """

    def answer_tokens(self, tokens: list) -> int:
        """Return how many of ``tokens`` (the generated ids) the answer keeps (all)."""
        return len(tokens)

    @abc.abstractmethod
    def should_stop(self, n_generated: int, last_token_id: Optional[int],
                    n_prefilled: Optional[int] = None) -> Optional[str]:
        """Return a stop reason, or None to go on.

        n_generated: tokens generated so far (0 during prefill).
        last_token_id: the token generated last, None during prefill.
        n_prefilled: prompt tokens already prefilled (during prefill), else None.
        """


class EosStop(StopCriterion):
    """Stop when the last token is one of ``eos_token_ids``."""

    def __init__(self, eos_token_ids: Iterable[int]):
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)

    def should_stop(self, n_generated, last_token_id, n_prefilled=None):
        """Return EOS when the last token ends the answer."""
        if last_token_id is not None and last_token_id in self.eos_token_ids:
            return EOS
        return None


class MaxTokensStop(StopCriterion):
    """Stop once ``n_max`` tokens have been generated (N <= N_max, Eq. 1c)."""

    def __init__(self, n_max: int):
        if not isinstance(n_max, int) or n_max < 1:
            raise ValueError(f'n_max must be an int >= 1, got {n_max!r}')
        self.n_max = n_max

    def should_stop(self, n_generated, last_token_id, n_prefilled=None):
        """Return MAX_TOKENS when N_max is reached."""
        return MAX_TOKENS if n_generated >= self.n_max else None


class CancelStop(StopCriterion):
    """Stop when ``cancel_event`` is set (the client canceled, or the server shuts down)."""

    def __init__(self, cancel_event: threading.Event):
        self.cancel_event = cancel_event

    def should_stop(self, n_generated, last_token_id, n_prefilled=None):
        """Return CANCELED once the event is set."""
        return CANCELED if self.cancel_event.is_set() else None


class DeadlineStop(StopCriterion):
    """Stop at an absolute deadline (monotonic seconds): the Kill overrun policy."""

    def __init__(self, deadline_s: float, clock: Callable[[], float] = time.monotonic):
        self.deadline_s = deadline_s
        self.clock = clock

    def should_stop(self, n_generated, last_token_id, n_prefilled=None):
        """Return DEADLINE once the clock reaches the deadline."""
        return DEADLINE if self.clock() >= self.deadline_s else None


class PrefillCannotFinish(StopCriterion):
    """Stop a prefill as soon as its remaining part cannot end before the deadline.

    least_remaining_s(n_prefilled) -> seconds: the least time the rest of the goal can take
    (rest of the prefill, the predictor overhang, one decoding step) from the time model.
    Checked before every prefill chunk; inactive during decoding.
    """

    def __init__(self, deadline_s: float, least_remaining_s: Callable[[int], float],
                 clock: Callable[[], float] = time.monotonic):
        self.deadline_s = deadline_s
        self.least_remaining_s = least_remaining_s
        self.clock = clock

    def should_stop(self, n_generated, last_token_id, n_prefilled=None):
        """Return CANNOT_FINISH when now + least remaining time > deadline."""
        if n_prefilled is None:
            return None
        if self.clock() + self.least_remaining_s(n_prefilled) > self.deadline_s:
            return CANNOT_FINISH
        return None


class NextStepCannotFinish(StopCriterion):
    """Stop decoding when the next step cannot end before the deadline.

    step_s(n_generated) -> seconds: the time of the next decoding step from the time model
    at the cache length it will see (its least time for Kill: a token that cannot arrive
    before the deadline cannot be part of an answer delivered on time; its worst time for an
    anytime answer, which must not be late).
    """

    def __init__(self, deadline_s: float, step_s: Callable[[int], float],
                 clock: Callable[[], float] = time.monotonic):
        self.deadline_s = deadline_s
        self.step_s = step_s
        self.clock = clock

    def should_stop(self, n_generated, last_token_id, n_prefilled=None):
        """Return CANNOT_FINISH when now + the next step's time > deadline."""
        if n_prefilled is not None or n_generated < 1:
            return None
        if self.clock() + self.step_s(n_generated) > self.deadline_s:
            return CANNOT_FINISH
        return None


class StepTimer(StopCriterion):
    """Never stops; records ``clock()`` at every decoding-step check (n_generated >= 1).

    The engine checks before every decoding step, so consecutive records bracket one step:
    :meth:`step_durations_s` gives seconds per step. ``clock`` returns seconds. ``sync``:
    called before each record (the engine's ``synchronize``: on a GPU the step before is
    then done, not only queued); None: none.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 sync: Optional[Callable[[], None]] = None):
        self.clock = clock
        self.sync = sync
        self.times_s = []

    def should_stop(self, n_generated, last_token_id, n_prefilled=None):
        """Record the time once generation has started; never return a reason."""
        if n_generated >= 1:
            if self.sync is not None:
                self.sync()
            self.times_s.append(self.clock())
        return None

    def step_durations_s(self):
        """Return the seconds between consecutive checks: one entry per decoding step."""
        return [b - a for a, b in zip(self.times_s, self.times_s[1:])]


class _TailCut(StopCriterion):
    """A criterion that follows the answer's tokens and may cut its tail when it fires.

    ``tokens``: the ids seen so far; ``keep``: how many the answer keeps once fired (None
    until then). Subclasses override :meth:`_fires` (the new token is ``tokens[-1]``).
    """

    reason = None

    def __init__(self):
        self.tokens = []
        self.keep = None

    def should_stop(self, n_generated, last_token_id, n_prefilled=None):
        """Add the new token (once per step); return ``reason`` once the criterion fired."""
        if last_token_id is not None and n_generated > len(self.tokens) and self.keep is None:
            self.tokens.append(last_token_id)
            self.keep = self._fires()
        return None if self.keep is None else self.reason

    def _fires(self) -> Optional[int]:
        """Return the tokens the answer keeps if it must end now, else None."""
        raise NotImplementedError

    def answer_tokens(self, tokens):
        """Return the tokens the answer keeps (all until the criterion fired)."""
        return len(tokens) if self.keep is None else min(self.keep, len(tokens))


#: :meth:`LoopGuard.steps_to_fire` trusts a cycle seen this many times over ...
LOOP_EVIDENCE_REPEATS = 3
#: ... spanning at least this many tokens. On the answers collected for both models'
#: predictors (guard not fired: 81 Gemma 3 270M, 194 SmolLM2-135M), no answer outran the
#: steps it gave (`timebill study loop_rest`, benchmarks/results/loop_rest/); a cycle seen
#: twice broke on 287 of 420 such claims (near-copies of a 25-token list item).
LOOP_EVIDENCE_TOKENS = 12


class LoopGuard(_TailCut):
    """Stop an answer that repeats a cycle of tokens: ``REPETITION``.

    The answer's tail is a loop when its last ``span`` tokens repeat one cycle of a period p
    (1 <= p <= ``max_period`` tokens) exactly, at least ``min_repeats`` times over, and span
    >= ``min_span`` tokens: a short table rule or a list of changing numbers is not one. One
    counter a period: the run of tokens equal to the token p before them, O(max_period) a
    step. The answer keeps its text up to the end of the cycle's first copy.
    """

    def __init__(self, max_period: int = 64, min_repeats: int = 3, min_span: int = 48):
        for name, value in (('max_period', max_period), ('min_repeats', min_repeats),
                            ('min_span', min_span)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f'{name} must be an int >= 1, got {value!r}')
        if min_repeats < 2:
            raise ValueError(f'min_repeats must be >= 2, got {min_repeats!r}')
        super().__init__()
        self.max_period, self.min_repeats, self.min_span = max_period, min_repeats, min_span
        self.runs = [0] * (max_period + 1)  # runs[p]: tokens equal to the one p before

    reason = REPETITION

    def _fires(self):
        """Keep up to the first copy's end when the tail became a loop."""
        tokens = self.tokens
        last = len(tokens) - 1
        for period in range(1, min(self.max_period, last) + 1):
            run = self.runs[period] + 1 if tokens[last - period] == tokens[last] else 0
            self.runs[period] = run
            span = run + period  # the tail of this length has period p
            if span >= self._fire_span(period):
                return len(tokens) - span + period
        return None

    def _fire_span(self, period):
        """Return the tail a cycle of ``period`` tokens must span for the guard to fire."""
        return max(self.min_span, self.min_repeats * period)

    def steps_to_fire(self, repeats: int = LOOP_EVIDENCE_REPEATS,
                      min_tokens: int = LOOP_EVIDENCE_TOKENS) -> Optional[int]:
        """Return the tokens still to come before the guard fires if the loop goes on, or None.

        A loop goes on once its tail has repeated a cycle ``repeats`` times over a span of
        at least ``min_tokens`` tokens (a greedy decoder rarely leaves such a loop: the
        figures at the constants); then the guard fires after max(min_span, min_repeats p)
        - span more tokens. None: no such loop now, or the guard fired. O(max_period); the
        checkpoints call it every m tokens.
        """
        if self.keep is not None:
            return None
        steps = None
        for period in range(1, min(self.max_period, len(self.tokens) - 1) + 1):
            span = self.runs[period] + period
            if span >= max(repeats * period, min_tokens):
                left = self._fire_span(period) - span
                steps = left if steps is None else min(steps, left)
        return None if steps is None else max(0, steps)


class StopStrings(_TailCut):
    """Stop when the answer's text contains one of ``stop`` strings: ``STOP_STRING``.

    text_of(token ids) -> str decodes the answer (the engine's tokenizer). The answer keeps
    the tokens up to the one that completed the earliest stop string; its text is cut before
    the string (:meth:`cut_text`). Checked before every step (the text decoded each time:
    about a millisecond for hundreds of tokens).
    """

    def __init__(self, stop: Iterable[str], text_of: Callable[[list], str]):
        self.stop = tuple(stop)
        if not self.stop or any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f'stop must be non-empty strings, got {stop!r}')
        self.text_of = text_of
        super().__init__()

    reason = STOP_STRING

    def _fires(self):
        """Keep every token so far once a stop string appears in the text."""
        if self.cut_text(self.text_of(self.tokens)) is not None:
            return len(self.tokens)
        return None

    def cut_text(self, text: str) -> Optional[str]:
        """Return ``text`` before its earliest stop string, or None when it has none."""
        found = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        return text[:min(found)] if found else None


class StopCriteria:
    """An ordered list of criteria; the first that fires gives the reason (``fired``)."""

    def __init__(self, criteria: Iterable[StopCriterion] = ()):
        self.criteria = list(criteria)
        self.fired = None

    def check(self, n_generated: int, last_token_id: Optional[int] = None,
              n_prefilled: Optional[int] = None) -> Optional[str]:
        """Return the first stop reason, or None (see :meth:`StopCriterion.should_stop`)."""
        for criterion in self.criteria:
            reason = criterion.should_stop(n_generated, last_token_id, n_prefilled)
            if reason is not None:
                self.fired = criterion
                return reason
        return None
