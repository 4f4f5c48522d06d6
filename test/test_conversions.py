"""The ROS conversions carry every JobResult field the action result and GoalEvent have."""

import dataclasses

import pytest

from timebill_ros.action import Instruct
from timebill_ros.msg import GoalEvent
from timebill_ros.ros.conversions import (duration_to_s, event_msg, result_sources,
                                          result_to_msg)
from timebill_ros.server import status
from timebill_ros.server.goals import JobResult

from builtin_interfaces.msg import Time


def _distinct_result():
    """Return a JobResult whose every numeric field has its own non-zero value."""
    values = {}
    for index, field in enumerate(dataclasses.fields(JobResult), start=1):
        if field.name in ('status', 'message', 'goal_id', 'response', 'predictor',
                          'executor', 'stop_phase', 'overrun_policy', 'finish_reason'):
            continue
        if field.type in (bool, 'bool'):
            values[field.name] = True
        elif field.type in (int, 'int'):
            values[field.name] = index
        elif field.type in (str, 'str'):  # a field added later, e.g. an echoed goal option
            values[field.name] = f'{field.name}-{index}'
        elif field.type in (tuple, 'tuple'):  # a sequence: whole numbers, exact in float32
            values[field.name] = (index, index + 1.0)
        else:
            values[field.name] = index + 0.25
    return JobResult(status=status.COMPLETED, message='m', goal_id='g', response='r',
                     predictor='p', executor='primary', overrun_policy='kill',
                     finish_reason=status.FINISH_EOS, **values)


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
            if isinstance(want, tuple):
                assert tuple(got) == want, name
                checked += 1
                continue
            assert abs(got - want) < 1e-3 if isinstance(want, float) else got == want, name
            checked += 1
        if hasattr(event, field.name) and field.name != 'overrun_policy':  # a code there
            got = getattr(event, field.name)
            assert abs(got - want) < 1e-3 if isinstance(want, float) else got == want, \
                field.name
    assert checked >= 20
    assert msg.cached_tokens == result.cached_tokens and event.cached_tokens > 0
    assert event.overrun_policy == 1  # POLICY_KILL


def test_every_result_and_event_field_has_a_source():
    """The mapping is made from the messages' own fields: none is left without a source."""
    result = result_sources(Instruct.Result)
    assert set(result) == set(Instruct.Result.get_fields_and_field_types())
    assert result['predicted_wcet'] == 'predicted_wcet_s' and result['status'] == 'status'
    event = result_sources(GoalEvent, given=('stamp', 'overrun_policy'))
    assert set(event) | {'stamp', 'overrun_policy'} == set(GoalEvent.get_fields_and_field_types())


def test_a_field_without_a_source_is_named():
    class Unknown:
        @staticmethod
        def get_fields_and_field_types():
            return {'status': 'uint8', 'wall_clock': 'builtin_interfaces/Duration'}

    with pytest.raises(KeyError, match=r'Unknown.wall_clock .*no JobResult source'):
        result_sources(Unknown)
