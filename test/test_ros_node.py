"""The real action server over real rclpy, driven by a plain rclpy ActionClient.

Tiny random-weight model, real SmolLM2 tokenizer, real generated interfaces.
"""

import threading
import time

from action_msgs.msg import GoalStatus
from builtin_interfaces.msg import Duration, Time
from diagnostic_msgs.msg import DiagnosticArray
import pytest
from rclpy.parameter import Parameter
from ros_helpers import goal_msg, node_and_client, SpinningActionClient, tiny_factory, wait_future
from service_helpers import slow_schema, wait_schema_compiles

from timebill_ros.server import status
from timebill_ros.action import Instruct
from timebill_ros.msg import GoalEvent, ServerStats


@pytest.fixture(scope='module')
def ros_graph(tiny_model, smollm2_tokenizer):
    """Start a timebill node in namespace /robot1 and a client node with subscriptions."""
    factory = tiny_factory(tiny_model, smollm2_tokenizer)
    overrides = [Parameter('engine.max_new_tokens', value=12),
                 Parameter('engine.feedback_every_tokens', value=1),
                 Parameter('stats.period_s', value=0.2)]
    with node_and_client(factory, 'robot1', overrides, 'planner_under_test') as (server,
                                                                                 client, _):
        seen = {'events': [], 'stats': [], 'diag': []}
        client.create_subscription(GoalEvent, '/robot1/timebill/events',
                                   seen['events'].append, 10)
        client.create_subscription(ServerStats, '/robot1/timebill/stats',
                                   seen['stats'].append, 10)
        client.create_subscription(DiagnosticArray, '/diagnostics', seen['diag'].append, 10)
        action = SpinningActionClient(client, Instruct, '/robot1/timebill/instruct')
        assert action.wait_for_server(timeout_sec=20)
        yield {'server': server, 'client': client, 'action': action, 'seen': seen}


def _wait(future, timeout=60.0):
    return wait_future(future, timeout, poll_s=0.01)


_goal = goal_msg


def _run(graph, goal, feedback=None, cancel_in_decode=False):
    decoding = threading.Event()

    def on_feedback(msg):
        if feedback is not None:
            feedback.append(msg.feedback)
        if msg.feedback.phase == Instruct.Feedback.PHASE_DECODE:
            decoding.set()

    handle = _wait(graph['action'].send_goal_async(goal, feedback_callback=on_feedback))
    assert handle.accepted
    if cancel_in_decode:
        assert decoding.wait(30), 'no decode feedback'
        _wait(handle.cancel_goal_async())
    response = _wait(handle.get_result_async())
    return response.status, response.result


def test_action_name_is_namespaced(ros_graph):
    from rclpy.action import get_action_names_and_types
    names = [name for name, _ in get_action_names_and_types(ros_graph['client'])]
    assert '/robot1/timebill/instruct' in names


def test_interface_constants_match_the_core():
    assert Instruct.Result.COMPLETED == status.COMPLETED
    assert Instruct.Result.KILLED == status.KILLED
    assert Instruct.Result.SKIPPED == status.SKIPPED
    assert Instruct.Result.REJECTED == status.REJECTED
    assert Instruct.Result.CANCELED == status.CANCELED
    assert Instruct.Result.FAILED == status.FAILED
    assert Instruct.Goal.POLICY_KILL == status.POLICY_KILL
    assert Instruct.Goal.POLICY_SKIP_NEXT == status.POLICY_SKIP_NEXT
    assert Instruct.Goal.POLICY_PARTIAL == status.POLICY_PARTIAL
    assert Instruct.Feedback.PHASE_DECODE == status.PHASE_DECODE


def test_every_error_code_is_in_the_action_with_the_core_value():
    codes = {name: getattr(Instruct.Result, name) for name in dir(Instruct.Result)
             if name.isupper() and isinstance(getattr(Instruct.Result, name), int)
             and getattr(Instruct.Result, name) not in status.STATUS_NAMES}
    assert codes == status.ERROR_CODES
    assert len(set(codes.values())) == len(codes)  # one code per cause


def test_goal_succeeds_with_feedback_events_stats_and_diagnostics(ros_graph):
    feedback = []
    goal_status, result = _run(ros_graph, _goal(), feedback)
    assert goal_status == GoalStatus.STATUS_SUCCEEDED
    assert result.status == Instruct.Result.COMPLETED, result.message
    assert result.deadline_met and result.response_tokens > 0
    assert result.total_time.sec > 0 or result.total_time.nanosec > 0
    assert any(f.phase == Instruct.Feedback.PHASE_DECODE and f.text for f in feedback)
    time.sleep(0.6)
    seen = ros_graph['seen']
    assert any(e.status == Instruct.Result.COMPLETED for e in seen['events'])
    assert seen['stats'] and seen['stats'][-1].total_goals >= 1
    statuses = [s for d in seen['diag'] for s in d.status if 'deadlines' in s.name]
    assert statuses and any(kv.key == 'completion_rate' for kv in statuses[-1].values)
    keys = {kv.key: kv.value for kv in statuses[-1].values}
    for key in ('active_goals', 'queue_depth', 'misses_total', 'consecutive_misses',
                'kill_latency_max_ms', 'wcet_coverage', 'speed_factor', 'firm_met'):
        assert key in keys, key
    assert float(keys['speed_factor']) > 0 and statuses[-1].hardware_id.endswith('/cpu')
    stats = seen['stats'][-1]
    assert stats.speed_factor_decode > 0 and stats.wcet_margin_decode >= 1.0
    assert stats.firm_window >= 1 and 0.0 <= stats.wcet_coverage <= 1.0
    assert result.queue_time.sec >= 0 and not result.truncated and not result.infeasible
    assert result.min_time.sec > 0 or result.min_time.nanosec > 0


@pytest.mark.parametrize('fields, cause', [
    ({'budget_s': 0}, 'both are zero'),
    ({'budget_s': -1}, '> 0'),
    ({'prompt': '  '}, 'empty'),
    ({'overrun_policy': 7}, 'unknown overrun_policy'),
    ({'max_new_tokens': 100000}, 'model capacity'),
])
def test_bad_goals_are_accepted_then_aborted_rejected(ros_graph, fields, cause):
    goal_status, result = _run(ros_graph, _goal(**fields))
    assert goal_status == GoalStatus.STATUS_ABORTED
    assert result.status == Instruct.Result.REJECTED and cause in result.message
    ok_status, ok = _run(ros_graph, _goal())
    assert ok_status == GoalStatus.STATUS_SUCCEEDED and ok.status == Instruct.Result.COMPLETED


def test_past_deadline_is_rejected(ros_graph):
    now = ros_graph['client'].get_clock().now().nanoseconds
    goal = _goal(budget_s=0)
    goal.deadline = Time(sec=int(now // 10**9) - 5, nanosec=0)
    goal_status, result = _run(ros_graph, goal)
    assert result.status == Instruct.Result.REJECTED and 'already past' in result.message


def test_absolute_deadline_in_the_future_is_served(ros_graph):
    now = ros_graph['client'].get_clock().now().nanoseconds
    goal = _goal(budget_s=0)
    goal.deadline = Time(sec=int(now // 10**9) + 60, nanosec=0)
    goal_status, result = _run(ros_graph, goal)
    assert result.status == Instruct.Result.COMPLETED, result.message


def test_kill_under_a_tight_budget(ros_graph):
    goal = _goal(prompt='Tell a very long story.', budget_s=0, max_new_tokens=2000,
                 overrun_policy=Instruct.Goal.POLICY_KILL)
    goal.time_budget = Duration(sec=0, nanosec=200_000_000)
    goal_status, result = _run(ros_graph, goal)
    assert goal_status == GoalStatus.STATUS_ABORTED
    assert result.status == Instruct.Result.KILLED and result.response == ''


def test_infeasible_goal_is_rejected_with_its_least_time(ros_graph):
    goal = _goal(budget_s=0, max_new_tokens=8)
    goal.time_budget = Duration(sec=0, nanosec=100_000)  # 0.1 ms: less than any prefill
    goal_status, result = _run(ros_graph, goal)
    assert goal_status == GoalStatus.STATUS_ABORTED
    assert result.status == Instruct.Result.REJECTED and result.infeasible
    assert 'infeasible: needs at least' in result.message
    assert result.min_time.nanosec > 100_000 or result.min_time.sec > 0
    assert result.prompt_tokens > 0 and result.response == ''
    time.sleep(0.5)
    events = [e for e in ros_graph['seen']['events'] if e.infeasible]
    assert events and events[-1].status == Instruct.Result.REJECTED


def test_partial_goal_returns_truncated_text(ros_graph):
    goal = _goal(prompt='Tell a very long story.', budget_s=0, max_new_tokens=2000,
                 overrun_policy=Instruct.Goal.POLICY_PARTIAL)
    goal.time_budget = Duration(sec=0, nanosec=300_000_000)
    goal_status, result = _run(ros_graph, goal)
    assert goal_status == GoalStatus.STATUS_SUCCEEDED
    assert result.status == Instruct.Result.COMPLETED and result.truncated
    assert result.response and 0 < result.response_tokens < 2000


def test_cancel_during_decode(ros_graph):
    goal = _goal(max_new_tokens=2000)
    goal_status, result = _run(ros_graph, goal, cancel_in_decode=True)
    assert goal_status == GoalStatus.STATUS_CANCELED
    assert result.status == Instruct.Result.CANCELED


def test_result_is_kept_for_a_client_that_asks_late(ros_graph):
    """Kilted's rclpy drops results after 10 s by default; ros.result_timeout_s keeps them."""
    handle = _wait(ros_graph['action'].send_goal_async(_goal()))
    goal_id = bytes(handle.goal_id.uuid).hex()
    end = time.monotonic() + 60
    while not any(e.goal_id == goal_id for e in ros_graph['seen']['events']):
        assert time.monotonic() < end, 'goal did not finish'
        time.sleep(0.05)
    time.sleep(11.0)
    response = _wait(handle.get_result_async())
    assert response.status == GoalStatus.STATUS_SUCCEEDED
    assert response.result.status == Instruct.Result.COMPLETED


def _results_through(server, change):
    """Make the node's service hand ``change(result)`` to the node instead of each result."""
    service = server.service
    original = service.submit

    def submit(request, on_feedback, on_done, **kwargs):
        return original(request, on_feedback, lambda result: on_done(change(result)), **kwargs)
    service.submit = submit
    return lambda: setattr(service, 'submit', original)


def test_a_non_finite_time_still_sends_the_answer(ros_graph):
    """A NaN time in a result is sent as 0 with a note; the goal keeps its answer and status.

    (It made the result conversion raise after the goal was marked done: the client got an
    empty Result with status 0.)
    """
    import dataclasses
    restore = _results_through(ros_graph['server'], lambda result: dataclasses.replace(
        result, decode_time_s=float('nan'), total_time_s=float('inf')))
    try:
        state, result = _run(ros_graph, _goal('Say hi.', budget_s=60))
    finally:
        restore()
    assert state == GoalStatus.STATUS_SUCCEEDED and result.status == status.COMPLETED
    assert 'decode_time_s, total_time_s not finite: sent as 0' in result.message
    assert result.total_time.sec == 0 and result.total_time.nanosec == 0


def test_a_result_that_cannot_be_sent_ends_failed_with_a_reason(ros_graph, monkeypatch):
    """A conversion fault (here: the first two attempts raise) ends the goal FAILED, sent."""
    from timebill_ros.ros import conversions
    original, calls = conversions.result_to_msg, []

    def result_to_msg(result):
        calls.append(result.status)
        if len(calls) <= 2:
            raise TypeError('a field of the wrong type')
        return original(result)
    monkeypatch.setattr(conversions, 'result_to_msg', result_to_msg)
    state, result = _run(ros_graph, _goal('Say hi.', budget_s=60))
    monkeypatch.undo()
    assert calls[:2] == [status.COMPLETED] * 2
    assert state == GoalStatus.STATUS_ABORTED and result.status == status.FAILED
    assert result.error_code == status.ERROR_INTERNAL
    assert 'the result could not be sent: TypeError: a field of the wrong type' in result.message
    state, result = _run(ros_graph, _goal('Say hi.', budget_s=60))  # the server serves on
    assert result.status == status.COMPLETED


def test_the_executor_has_a_thread_for_every_goal_that_may_wait_or_run(ros_graph):
    """Queued goals, a batch of continuous batching and the offload goal each hold a thread.

    (The pool was queue.max_depth + 4: with batching and offload, cancels waited.)
    """
    import dataclasses

    from timebill_ros.config import OffloadConfig, QueueConfig, SchedulerConfig
    from timebill_ros.server.executor import max_running_goals
    server = ros_graph['server']
    config = server.config
    assert server.executor_threads == config.queue.max_depth + max_running_goals(config) + 4
    busy = dataclasses.replace(
        config, queue=QueueConfig(max_depth=3),
        scheduler=SchedulerConfig(continuous=True, batch_size=4),
        offload=dataclasses.replace(OffloadConfig(), enabled=True))
    assert max_running_goals(busy) == 4 + 1
    assert max_running_goals(dataclasses.replace(
        busy, scheduler=SchedulerConfig(consolidation=True, batch_size=0))) == 8 + 1
    assert max_running_goals(dataclasses.replace(
        busy, offload=OffloadConfig())) == 4
    saved = server.config
    server.config = busy
    try:
        assert server.executor_threads == 3 + 5 + 4
    finally:
        server.config = saved


def test_a_slow_schema_compile_holds_no_other_goal(ros_graph):
    """A goal sent while another's json_schema compiles is served meanwhile (issue 58)."""
    slow = _goal(json_schema=slow_schema('ros'))  # ~1.9 s of compile on 2 idle x86 cores
    action = ros_graph['action']
    schema_handle = _wait(action.send_goal_async(slow))
    schema_result = schema_handle.get_result_async()
    time.sleep(0.1)  # its compile has begun
    heard = []
    sent = time.monotonic()
    handle = _wait(action.send_goal_async(
        _goal(), feedback_callback=lambda msg: heard.append(time.monotonic())))
    while not heard and not schema_result.done():
        time.sleep(0.002)
    assert heard, 'the goal was held until the schema goal ended'
    print(f'first feedback {1e3 * (heard[0] - sent):.1f} ms after the goal was sent')
    _wait(schema_result)  # compiled within queue.max_schema_compile_s (2 s) or refused
    assert _wait(handle.get_result_async()).result.status == Instruct.Result.COMPLETED
    wait_schema_compiles()
