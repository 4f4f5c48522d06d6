"""Conversions between Instruct action messages and the core's dataclasses."""

import dataclasses
import math

from builtin_interfaces.msg import Duration, Time

from timebill_ros.action import Instruct
from timebill_ros.server.goals import GoalRequest
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


def result_to_msg(result) -> Instruct.Result:
    """Return the action result for a core JobResult."""
    return Instruct.Result(
        status=result.status, error_code=int(result.error_code), message=result.message,
        response=result.response,
        prompt_tokens=result.prompt_tokens, response_tokens=result.response_tokens,
        predicted_tokens=result.predicted_tokens, pessimistic_tokens=result.pessimistic_tokens,
        eviction_ratio=float(result.eviction_ratio),
        predicted_wcet=s_to_duration(result.predicted_wcet_s),
        predict_time=s_to_duration(result.predict_time_s),
        prefill_time=s_to_duration(result.prefill_time_s),
        decode_time=s_to_duration(result.decode_time_s),
        total_time=s_to_duration(result.total_time_s),
        deadline_met=bool(result.deadline_met), predictor=result.predictor,
        truncated=bool(result.truncated), infeasible=bool(result.infeasible),
        min_time=s_to_duration(result.min_time_s), queue_time=s_to_duration(result.queue_time_s),
        executor=result.executor, uncertainty_tokens=int(result.uncertainty_tokens),
        batch_size=int(result.batch_size), cached_tokens=int(result.cached_tokens),
        finish_reason=result.finish_reason,
        schedule_time=s_to_duration(result.schedule_time_s))


def feedback_to_msg(feedback) -> Instruct.Feedback:
    """Return the action feedback for a core Feedback."""
    return Instruct.Feedback(
        phase=feedback.phase, tokens_generated=feedback.tokens_generated, text=feedback.text,
        elapsed=s_to_duration(feedback.elapsed_s),
        eviction_ratio=float(feedback.eviction_ratio))


def event_msg(result, stamp: Time) -> GoalEvent:
    """Return the ~/events message for a terminal JobResult."""
    policy = {'kill': Instruct.Goal.POLICY_KILL, 'skip_next': Instruct.Goal.POLICY_SKIP_NEXT,
              'partial': Instruct.Goal.POLICY_PARTIAL}
    return GoalEvent(
        stamp=stamp, goal_id=result.goal_id, status=result.status,
        error_code=int(result.error_code), message=result.message,
        overrun_policy=policy.get(result.overrun_policy, 0), budget_s=float(result.budget_s),
        total_time_s=float(result.total_time_s),
        predicted_wcet_s=float(result.predicted_wcet_s),
        eviction_ratio=float(result.eviction_ratio), prompt_tokens=result.prompt_tokens,
        response_tokens=result.response_tokens, deadline_met=bool(result.deadline_met),
        truncated=bool(result.truncated), infeasible=bool(result.infeasible),
        queue_time_s=float(result.queue_time_s),
        kill_latency_s=float(result.kill_latency_s or 0.0), executor=result.executor,
        uncertainty_tokens=int(result.uncertainty_tokens), batch_size=int(result.batch_size),
        cached_tokens=int(result.cached_tokens), finish_reason=result.finish_reason)
