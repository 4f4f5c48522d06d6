"""Conversions between Instruct action messages and the core's dataclasses."""

import dataclasses
import functools
import math

from builtin_interfaces.msg import Duration, Time

from timebill_ros.action import Instruct
from timebill_ros.server.goals import GoalRequest, JobResult
from timebill_ros.server.overrun import POLICY_CODES
from timebill_ros.msg import GoalEvent

NS_PER_S = 1_000_000_000


def duration_to_s(duration: Duration) -> float:
    """Return a Duration in seconds."""
    return duration.sec + duration.nanosec / NS_PER_S


def time_to_s(stamp: Time) -> float:
    """Return a Time in seconds since its clock's epoch."""
    return stamp.sec + stamp.nanosec / NS_PER_S


def s_to_duration(seconds: float) -> Duration:
    """Return a Duration for a non-negative number of seconds (negatives clamp to 0).

    ValueError for a non-finite number.
    """
    if not math.isfinite(seconds):
        raise ValueError(f'a duration must be a finite number of seconds, got {seconds!r}')
    total_ns = max(0, int(round(seconds * NS_PER_S)))
    return Duration(sec=total_ns // NS_PER_S, nanosec=total_ns % NS_PER_S)


def finite_times(result):
    """Return a copy of JobResult ``result`` whose non-finite float fields are 0, noted.

    The message names the fields; the result is otherwise unchanged.
    """
    bad = [field.name for field in dataclasses.fields(result)
           if isinstance(getattr(result, field.name), float)
           and not math.isfinite(getattr(result, field.name))]
    if not bad:
        return result
    note = f'{", ".join(bad)} not finite: sent as 0'
    return dataclasses.replace(result, message=f'{result.message} ({note})' if result.message
                               else note, **{name: 0.0 for name in bad})


def request_from_goal(goal, goal_id, ros_now_s, mono_now_s) -> GoalRequest:
    """Build a GoalRequest; a non-zero ROS deadline is moved onto the monotonic clock.

    ros_now_s / mono_now_s: the ROS clock and the service clock read at goal receipt.
    """
    budget_s = duration_to_s(goal.time_budget)
    deadline_ros_s = time_to_s(goal.deadline)
    deadline_s = None if deadline_ros_s == 0 else mono_now_s + (deadline_ros_s - ros_now_s)
    return GoalRequest(
        prompt=goal.prompt, system_prompt=goal.system_prompt,
        budget_s=None if budget_s == 0 else budget_s, deadline_s=deadline_s,
        max_new_tokens=int(goal.max_new_tokens), overrun_policy=int(goal.overrun_policy),
        goal_id=goal_id, stop=tuple(goal.stop),
        messages=tuple((m.role, m.content) for m in goal.messages),
        temperature=float(goal.temperature), top_p=float(goal.top_p) or 1.0,
        top_k=int(goal.top_k), repetition_penalty=float(goal.repetition_penalty) or 1.0,
        seed=int(goal.seed) or None, json_schema=goal.json_schema)


# How a message field's value is made from a JobResult attribute, by the field's ROS type.
_CASTS = {'boolean': bool, 'string': str, 'float': float, 'double': float, 'uint8': int,
          'uint16': int, 'uint32': int, 'uint64': int, 'int32': int, 'int64': int}
_CASTS.update({f'sequence<{kind}>': (lambda cast: lambda values: [cast(v) for v in values])(cast)
               for kind, cast in tuple(_CASTS.items()) if kind != 'string'})
DURATION = 'builtin_interfaces/Duration'


@functools.lru_cache(maxsize=None)
def result_sources(msg_type, given=()):
    """Return {field: JobResult attribute} of a result message (``given`` fields: none).

    The mapping is made from the message's own fields, so a field added to the .action or
    .msg needs only its JobResult attribute: a Duration field ``x`` comes from ``x_s``
    (seconds), any other field from the attribute of its name. KeyError names a field
    without a source. Made once per message type (cached): every goal's result and event
    read it.
    """
    names = {field.name for field in dataclasses.fields(JobResult)}
    sources = {}
    for name, kind in msg_type.get_fields_and_field_types().items():
        if name in given:
            continue
        source = f'{name}_s' if kind == DURATION else name
        if source not in names or (kind != DURATION and kind not in _CASTS):
            raise KeyError(f'{msg_type.__name__}.{name} ({kind}) has no JobResult source')
        sources[name] = source
    return sources


def _from_result(msg_type, result, **given):
    """Return ``msg_type`` filled from JobResult ``result``; ``given`` fields as they are."""
    kinds = msg_type.get_fields_and_field_types()
    values = dict(given)
    for name, source in result_sources(msg_type, tuple(sorted(given))).items():
        value = getattr(result, source)
        if kinds[name] == DURATION:
            values[name] = s_to_duration(value)
        else:  # None (e.g. kill_latency_s of a goal that was not killed) is sent as 0
            values[name] = _CASTS[kinds[name]](0 if value is None else value)
    return msg_type(**values)


def result_to_msg(result) -> Instruct.Result:
    """Return the action result for a core JobResult."""
    return _from_result(Instruct.Result, result)


def feedback_to_msg(feedback) -> Instruct.Feedback:
    """Return the action feedback for a core Feedback."""
    return Instruct.Feedback(
        phase=feedback.phase, tokens_generated=feedback.tokens_generated, text=feedback.text,
        elapsed=s_to_duration(feedback.elapsed_s),
        eviction_ratio=float(feedback.eviction_ratio))


def event_msg(result, stamp: Time) -> GoalEvent:
    """Return the ~/events message for a terminal JobResult."""
    return _from_result(GoalEvent, result, stamp=stamp,
                        overrun_policy=POLICY_CODES.get(result.overrun_policy, 0))
