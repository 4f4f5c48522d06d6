"""Goal requests, feedback and results of the core service, and goal validation.

Times are seconds on the service clock (monotonic). The ROS adapter converts
``builtin_interfaces`` Durations/Times to these and back.
"""

import dataclasses
import math
from typing import Optional

from timebill_ros.engine.sampling import SamplingConfig
from timebill_ros.server import overrun, status


@dataclasses.dataclass(frozen=True)
class GoalRequest:
    """One instruction goal.

    budget_s: time budget T from receipt, seconds; None = use deadline_s.
    deadline_s: absolute deadline on the service clock, seconds; None = use budget_s.
    max_new_tokens: N_max for this goal, tokens; 0 = server default.
    overrun_policy: a ``status.POLICY_*`` code.
    stop: strings that end the answer (the response stops before the first one found).
    messages: an earlier conversation, ``(role, content)`` pairs (roles ``system`` - first
    only, ``user``, ``assistant``), between ``system_prompt`` and ``prompt`` (which may then
    be empty: the conversation's last turn must be the user's).
    temperature (0 = greedy), top_p (0, 1], top_k (0 = off), repetition_penalty (>= 1; 1 =
    off), seed (None = unseeded): the answer's sampling (engine/sampling.py).
    json_schema: a JSON schema (text); not empty: the answer is one JSON document valid
    against it (engine/grammar.py).
    """

    prompt: str
    system_prompt: str = ''
    budget_s: Optional[float] = None
    deadline_s: Optional[float] = None
    max_new_tokens: int = 0
    overrun_policy: int = status.POLICY_DEFAULT
    goal_id: str = ''
    stop: tuple = ()
    messages: tuple = ()
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: Optional[int] = None
    json_schema: str = ''


@dataclasses.dataclass(frozen=True)
class Feedback:
    """Progress of a goal: phase, tokens so far, new text, seconds since receipt, alpha."""

    phase: int
    tokens_generated: int = 0
    text: str = ''
    elapsed_s: float = 0.0
    eviction_ratio: float = 0.0


@dataclasses.dataclass
class JobResult:
    """Terminal result of a goal; field meanings as in ``Instruct.action``'s result.

    Seconds throughout. kill_latency_s: for KILLED goals, stop time - deadline (negative when
    the goal was stopped early because it could no longer finish). stop_phase: where the
    goal ended ('queue', 'prefill', 'predictor', 'eviction', 'decode'); execution_time_s:
    start of its run to its end (queueing excluded), what t^_WCET bounds.
    executor: the executor that ran it ('' if none did). uncertainty_tokens: u_J, the length
    predicted while the goal was queued (tokens; 0 when it started without waiting).
    schedule_time_s: scheduling overhead of the goal: the scheduler's choice that picked it
    (seconds). An admission-time prediction is in predict_time_s, not here.
    batch_size: the most goals decoding together with it at one step
    (``scheduler.consolidation``; 1 = alone, 0 = it never ran; a goal that ended before
    decoding: the goals taken with it).
    cached_tokens: prompt tokens its prefill copied from the prefix store (0: none).
    finish_reason: why the answer ended, one of ``status.FINISH_REASONS``.
    error_code: why it did not complete, one of ``status.ERROR_*`` (0: it completed or was
    canceled).
    max_tokens_sent: a remote goal's request max_tokens, tokens (timing/remote.py
    decide_max_tokens); 0 when it ran locally or sent no request.
    checkpoint_tokens, checkpoint_ratios, checkpoint_wcet_s: timebill-online
    (``budget.checkpoint_tokens``): at each re-decision while it decoded, the tokens
    generated, alpha after it (share of the prompt KV evicted) and t^_WCET of the run then
    (seconds, queue excluded); empty without checkpoints. eviction_ratio is then the last
    alpha. rest_error_tokens: the last checkpoint's N^_rem minus the tokens that came after
    it (0 without a checkpoint).
    """

    status: int
    message: str
    goal_id: str = ''
    response: str = ''
    prompt_tokens: int = 0
    response_tokens: int = 0
    predicted_tokens: int = 0
    pessimistic_tokens: int = 0
    eviction_ratio: float = 0.0
    predicted_wcet_s: float = 0.0
    predict_time_s: float = 0.0
    prefill_time_s: float = 0.0
    decode_time_s: float = 0.0
    total_time_s: float = 0.0
    deadline_met: bool = False
    predictor: str = ''
    overrun_policy: str = ''
    budget_s: float = 0.0
    kill_latency_s: Optional[float] = None
    truncated: bool = False
    infeasible: bool = False
    min_time_s: float = 0.0
    queue_time_s: float = 0.0
    execution_time_s: float = 0.0
    stop_phase: str = ''
    executor: str = ''
    uncertainty_tokens: int = 0
    schedule_time_s: float = 0.0
    batch_size: int = 0
    cached_tokens: int = 0
    finish_reason: str = ''
    error_code: int = 0
    max_tokens_sent: int = 0
    checkpoint_tokens: tuple = ()
    checkpoint_ratios: tuple = ()
    checkpoint_wcet_s: tuple = ()
    rest_error_tokens: int = 0

    @property
    def status_name(self) -> str:
        """Return the status as text, e.g. 'COMPLETED'."""
        return status.STATUS_NAMES.get(self.status, f'UNKNOWN({self.status})')


class GoalRejected(ValueError):
    """A goal was refused before any model work; the message names the bad field and value.

    error_code: the result's ``error_code`` (``status.ERROR_*``), by default the subclass's.
    """

    error_code = status.ERROR_INVALID_OPTION

    def __init__(self, message, error_code=None):
        super().__init__(message)
        if error_code is not None:
            self.error_code = error_code


class InvalidTiming(GoalRejected):
    """time_budget / deadline are missing, both set, not positive or already past."""

    error_code = status.ERROR_INVALID_TIMING


class InvalidPrompt(GoalRejected):
    """prompt, system_prompt or messages are empty, of the wrong type or role."""

    error_code = status.ERROR_INVALID_PROMPT


def _seconds_or_none(name, value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTiming(f'{name} must be a number of seconds, got {value!r}')
    if math.isnan(value) or math.isinf(value):
        raise InvalidTiming(f'{name} must be finite, got {value!r}')
    return float(value)


def resolve_deadline(request: GoalRequest, received_s: float) -> float:
    """Return the absolute deadline (service-clock seconds) of a goal received at received_s.

    Raises GoalRejected when neither or both of budget and deadline are given, or when the
    budget is not > 0, or the deadline is not after received_s.
    """
    budget_s = _seconds_or_none('time_budget', request.budget_s)
    deadline_s = _seconds_or_none('deadline', request.deadline_s)
    if budget_s is None and deadline_s is None:
        raise InvalidTiming('no time limit: set time_budget or deadline (both are zero)')
    if budget_s is not None and deadline_s is not None:
        raise InvalidTiming('set only one of time_budget and deadline, both are non-zero')
    if budget_s is not None:
        if budget_s <= 0:
            raise InvalidTiming(f'time_budget must be > 0 s, got {budget_s!r}')
        return received_s + budget_s
    if deadline_s <= received_s:
        raise InvalidTiming(
            f'deadline already past by {received_s - deadline_s:.3f} s at goal receipt')
    return deadline_s


def resolve_policy(request: GoalRequest, default_policy: str) -> str:
    """Return the overrun policy name of a goal (a key of server.overrun.POLICIES)."""
    code = request.overrun_policy
    if code == status.POLICY_DEFAULT:
        return default_policy
    if code not in overrun.POLICY_BY_CODE:
        raise GoalRejected(
            f'unknown overrun_policy {code!r}; expected {overrun.codes_text()}')
    return overrun.POLICY_BY_CODE[code]


def resolve_max_new_tokens(request: GoalRequest, default_n_max: int, n_model: int) -> int:
    """Return N_max for a goal, tokens; reject values above N_model."""
    n_max = request.max_new_tokens
    if isinstance(n_max, bool) or not isinstance(n_max, int) or n_max < 0:
        raise GoalRejected(f'max_new_tokens must be an int >= 0, got {n_max!r}')
    if n_max == 0:
        return default_n_max
    if n_max > n_model:
        raise GoalRejected(
            f'max_new_tokens {n_max} exceeds the model capacity of {n_model} tokens')
    return n_max


MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


def check_stop(request: GoalRequest) -> tuple:
    """Return the goal's stop strings; reject more than 16, empty ones or ones over 256 chars."""
    stop = request.stop
    if isinstance(stop, str) or not isinstance(stop, (list, tuple)):
        raise GoalRejected(f'stop must be a list of strings, got {stop!r}')
    if len(stop) > MAX_STOP_STRINGS:
        raise GoalRejected(f'stop: at most {MAX_STOP_STRINGS} strings, got {len(stop)}')
    for index, text in enumerate(stop):
        if not isinstance(text, str) or not text:
            raise GoalRejected(f'stop[{index}] must be a non-empty string, got {text!r}')
        if len(text) > MAX_STOP_CHARS:
            raise GoalRejected(f'stop[{index}] is {len(text)} characters; at most '
                               f'{MAX_STOP_CHARS}')
    return tuple(stop)


ROLES = ('system', 'user', 'assistant')


def check_prompt(request: GoalRequest, max_chars: Optional[int] = None) -> tuple:
    """Reject non-string fields, prompts over ``max_chars``, empty or whitespace-only prompts.

    Returns the goal's checked ``messages`` (:func:`check_messages`).

    max_chars: cap on the characters of prompt, system_prompt and messages together (None: no
    cap); checked first, so an oversized goal costs nothing before it is refused. With
    ``messages`` the prompt may be empty; the conversation must then end with a user turn.
    """
    if not isinstance(request.prompt, str) or not isinstance(request.system_prompt, str):
        raise InvalidPrompt('prompt and system_prompt must be strings')
    messages = check_messages(request)
    n_chars = (len(request.prompt) + len(request.system_prompt)
               + sum(len(content) for _, content in messages))
    if max_chars is not None and n_chars > max_chars:
        raise GoalRejected(f'prompt too large: {n_chars} characters (prompt + system_prompt + '
                           f'messages), queue.max_prompt_chars={max_chars}',
                           error_code=status.ERROR_PROMPT_TOO_LARGE)
    if not request.prompt.strip():
        if not messages:
            raise InvalidPrompt('prompt is empty or whitespace')
        if request.prompt or messages[-1][0] != 'user':
            raise InvalidPrompt('prompt is empty: the last of messages must then be a user turn '
                                f'with text, got role {messages[-1][0]!r}')
    return messages


def check_schema(request: GoalRequest, max_chars: Optional[int] = None) -> None:
    """Reject a json_schema that is not a string, or longer than ``max_chars`` characters.

    Checked before the schema is compiled, so an oversized one costs nothing (None: no cap).
    """
    text = request.json_schema
    if not isinstance(text, str):
        raise GoalRejected(f'json_schema must be a string, got {type(text).__name__}',
                           error_code=status.ERROR_INVALID_SCHEMA)
    if max_chars is not None and len(text) > max_chars:
        raise GoalRejected(f'json_schema too large: {len(text)} characters, '
                           f'queue.max_schema_chars={max_chars}',
                           error_code=status.ERROR_INVALID_SCHEMA)


def check_messages(request: GoalRequest) -> tuple:
    """Return the goal's ``messages`` as ``(role, content)`` pairs; reject bad ones.

    Roles: ``system`` (only as the first message, and only without ``system_prompt``),
    ``user``, ``assistant``; contents: non-empty strings.
    """
    messages = request.messages
    if isinstance(messages, str) or not isinstance(messages, (list, tuple)):
        raise InvalidPrompt(f'messages must be a list of (role, content), got {messages!r}')
    for index, message in enumerate(messages):
        if (not isinstance(message, (list, tuple)) or len(message) != 2
                or not all(isinstance(part, str) for part in message)):
            raise InvalidPrompt(f'messages[{index}] must be (role, content) strings, got '
                                f'{message!r}')
        role, content = message
        if role not in ROLES:
            raise InvalidPrompt(f'messages[{index}].role must be one of {ROLES}, got {role!r}')
        if role == 'system' and (index > 0 or request.system_prompt):
            raise InvalidPrompt(f'messages[{index}]: a system turn may only come first, and '
                                'not with system_prompt')
        if not content.strip():
            raise InvalidPrompt(f'messages[{index}].content is empty or whitespace')
    return tuple(tuple(message) for message in messages)


def resolve_sampling(request: GoalRequest) -> SamplingConfig:
    """Return the goal's engine.sampling.SamplingConfig; GoalRejected names a bad field."""
    try:
        return SamplingConfig(request.temperature, request.top_p, request.top_k,
                              request.repetition_penalty, request.seed)
    except ValueError as exc:
        raise GoalRejected(str(exc)) from None
