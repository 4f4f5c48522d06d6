"""Per-step stop criteria for generation: EOS, N_max, cancel, deadline, cannot-finish.

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


class StopCriterion(abc.ABC):
    """Decides whether generation stops now."""

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
    :meth:`step_durations_s` gives seconds per step. ``clock`` returns seconds.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.times_s = []

    def should_stop(self, n_generated, last_token_id, n_prefilled=None):
        """Record the time once generation has started; never return a reason."""
        if n_generated >= 1:
            self.times_s.append(self.clock())
        return None

    def step_durations_s(self):
        """Return the seconds between consecutive checks: one entry per decoding step."""
        return [b - a for a, b in zip(self.times_s, self.times_s[1:])]


class StopCriteria:
    """An ordered list of criteria; the first that fires gives the reason."""

    def __init__(self, criteria: Iterable[StopCriterion] = ()):
        self.criteria = list(criteria)

    def check(self, n_generated: int, last_token_id: Optional[int] = None,
              n_prefilled: Optional[int] = None) -> Optional[str]:
        """Return the first stop reason, or None (see :meth:`StopCriterion.should_stop`)."""
        for criterion in self.criteria:
            reason = criterion.should_stop(n_generated, last_token_id, n_prefilled)
            if reason is not None:
                return reason
        return None
