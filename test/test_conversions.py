"""The ROS conversions carry every JobResult field the action result and GoalEvent have."""

import dataclasses

from timebill_ros.ros.conversions import duration_to_s, event_msg, result_to_msg
from timebill_ros.server import status
from timebill_ros.server.goals import JobResult

from builtin_interfaces.msg import Time


def _distinct_result():
    """Return a JobResult whose every numeric field has its own non-zero value."""
    values = {}
    for index, field in enumerate(dataclasses.fields(JobResult), start=1):
        if field.name in ('status', 'message', 'goal_id', 'response', 'predictor',
                          'executor', 'stop_phase', 'overrun_policy'):
            continue
        if field.type in (bool, 'bool'):
            values[field.name] = True
        elif field.type in (int, 'int'):
            values[field.name] = index
        else:
            values[field.name] = index + 0.25
    return JobResult(status=status.COMPLETED, message='m', goal_id='g', response='r',
                     predictor='p', executor='primary', overrun_policy='kill', **values)


def test_the_result_and_event_carry_each_field_they_have():
    result = _distinct_result()
    msg, event = result_to_msg(result), event_msg(result, Time())
    checked = 0
    for field in dataclasses.fields(JobResult):
        want = getattr(result, field.name)
        name = field.name[:-2] if field.name.endswith('_s') else field.name
        if hasattr(msg, name):
            got = getattr(msg, name)
            got = duration_to_s(got) if hasattr(got, 'nanosec') else got
            assert abs(got - want) < 1e-3 if isinstance(want, float) else got == want, name
            checked += 1
        if hasattr(event, field.name) and field.name != 'overrun_policy':  # a code there
            got = getattr(event, field.name)
            assert abs(got - want) < 1e-3 if isinstance(want, float) else got == want, \
                field.name
    assert checked >= 20
    assert msg.cached_tokens == result.cached_tokens and event.cached_tokens > 0
    assert event.overrun_policy == 1  # POLICY_KILL
