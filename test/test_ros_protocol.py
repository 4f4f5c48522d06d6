"""Action protocol edges and fault isolation of the real node over real rclpy (issue 10).

Tiny random-weight model, real SmolLM2 tokenizer, real generated interfaces. A gate inside
the engine's prefill holds a goal in place, so goals queue behind it without depending on
how fast this machine is.
"""

import random
import threading
import time

from action_msgs.msg import GoalInfo, GoalStatus
from action_msgs.srv import CancelGoal
import pytest
import rclpy
from rclpy.action.server import ServerGoalHandle
from rclpy.executors import MultiThreadedExecutor
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.parameter import Parameter
from ros_helpers import (COEFFS, CONSISTENT, GatedEngine, goal_msg, node_and_client, R,
                         SpinningActionClient, wait_future)
from unique_identifier_msgs.msg import UUID

from timebill_ros.action import Instruct
from timebill_ros.predictors import FallbackPredictor
from timebill_ros.ros.spin import spin_through_faults
from timebill_ros.server.service import TimeBillService


@pytest.fixture(scope='module')
def graph(tiny_model, smollm2_tokenizer):
    """Yield a timebill node (namespace /proto) and a client node on one executor."""
    built = {}

    def factory(config, log):
        engine = GatedEngine(config.engine, config.eviction, model=tiny_model,
                             tokenizer=smollm2_tokenizer)
        built['engine'] = engine
        return TimeBillService(config, engine, FallbackPredictor(), COEFFS, log=log)

    overrides = [Parameter('engine.max_new_tokens', value=8),
                 Parameter('queue.max_depth', value=16),
                 Parameter('stats.period_s', value=0.1)]
    with node_and_client(factory, 'proto', overrides, 'protocol_client', extra_threads=4,
                         through_faults=True) as (server, client, spinner):
        action = SpinningActionClient(client, Instruct, '/proto/timebill/instruct')
        cancel = client.create_client(CancelGoal,
                                      '/proto/timebill/instruct/_action/cancel_goal')
        assert action.wait_for_server(timeout_sec=20)
        assert cancel.wait_for_service(timeout_sec=20)
        yield {'server': server, 'engine': built['engine'], 'action': action,
               'cancel': cancel, 'spinner': spinner}
        built['engine'].gate.set()


_wait = wait_future


def _goal(prompt='Plan a route to the dock.', budget_s=600, **fields):
    return goal_msg(prompt, budget_s, **fields)


def _send(graph, goal=None):
    handle = _wait(graph['action'].send_goal_async(goal or _goal()))
    assert handle.accepted
    return handle


@pytest.fixture
def held(graph):
    """Hold the executor: a first goal waits in its prefill until the test ends."""
    engine = graph['engine']
    engine.gate.clear()
    first = _send(graph)
    assert engine.waiting.wait(30), 'the first goal did not reach its prefill'
    yield first
    engine.gate.set()
    _wait(first.get_result_async())


def _cancel_request(goal_id_bytes=bytes(16)):
    return CancelGoal.Request(goal_info=GoalInfo(goal_id=UUID(uuid=list(goal_id_bytes))))


# --- cancel protocol ---------------------------------------------------------------------
def test_a_queued_goal_canceled_reaches_the_client_as_canceled(graph, held, monkeypatch):
    """Ended inside the cancel callback, before rclpy's CANCELING: still *canceled*.

    The callback is slowed after the cancel (as a preempted thread would be), so the goal's
    execute thread always looks at its handle before rclpy moved it to CANCELING.
    """
    service = graph['server'].service
    real_cancel = service.cancel

    def slow_cancel(job):
        real_cancel(job)
        time.sleep(0.2)

    monkeypatch.setattr(service, 'cancel', slow_cancel)
    for _ in range(3):
        queued = _send(graph)
        cancel = _wait(queued.cancel_goal_async())
        assert cancel.return_code == CancelGoal.Response.ERROR_NONE
        response = _wait(queued.get_result_async())
        assert response.status == GoalStatus.STATUS_CANCELED, response.result.message
        assert response.result.status == R.CANCELED


def test_a_cancel_inside_rclpys_execute_transition_still_ends_the_goal(graph, monkeypatch):
    """A cancel between rclpy's is_cancel_requested check and its EXECUTE transition.

    rclpy's ServerGoalHandle.execute() checks and transitions without a lock; a cancel
    processed in between made the transition raise and the goal never got a result (found by
    bench/studies/responsiveness.py). The window is widened here by 0.3 s.
    """
    real_update = ServerGoalHandle._update_state

    def slow_execute_transition(goal_handle, event):
        if event == _rclpy.GoalEvent.EXECUTE:
            time.sleep(0.3)
        real_update(goal_handle, event)

    monkeypatch.setattr(ServerGoalHandle, '_update_state', slow_execute_transition)
    for _ in range(2):
        handle = _send(graph)
        assert _wait(handle.cancel_goal_async()).return_code == CancelGoal.Response.ERROR_NONE
        response = _wait(handle.get_result_async(), timeout=10)
        assert response.status == GoalStatus.STATUS_CANCELED, response.result.message
        assert response.result.status == R.CANCELED


def test_a_cancel_before_the_job_is_submitted_is_not_lost(graph, monkeypatch):
    """The cancel callback runs while the execute callback is still submitting the job.

    rclpy moves the goal to CANCELING only after the cancel callback returns; slowed here
    (0.3 s), as is the submit (0.2 s), the execute callback sees no cancel on the handle.
    Before the fix the goal ran to the end and SUCCEEDED (found by test_ros_process's
    responsiveness test: a queued goal ran 38 s later).
    """
    real_update = ServerGoalHandle._update_state
    service = graph['server'].service
    real_submit = service.submit

    def slow_cancel_transition(goal_handle, event):
        if event == _rclpy.GoalEvent.CANCEL_GOAL:
            time.sleep(0.3)
        real_update(goal_handle, event)

    def slow_submit(*args, **kwargs):
        time.sleep(0.2)
        return real_submit(*args, **kwargs)

    monkeypatch.setattr(ServerGoalHandle, '_update_state', slow_cancel_transition)
    monkeypatch.setattr(service, 'submit', slow_submit)
    handle = _send(graph)
    assert _wait(handle.cancel_goal_async()).return_code == CancelGoal.Response.ERROR_NONE
    response = _wait(handle.get_result_async(), timeout=10)
    assert response.status == GoalStatus.STATUS_CANCELED, response.result.message
    assert response.result.status == R.CANCELED
    assert graph['server'].goals.early_cancels == {}


def test_cancel_of_an_unknown_goal_id(graph):
    response = _wait(graph['cancel'].call_async(_cancel_request(bytes(range(1, 17)))))
    assert response.return_code == CancelGoal.Response.ERROR_UNKNOWN_GOAL_ID
    assert list(response.goals_canceling) == []


def test_cancel_of_a_finished_goal(graph):
    handle = _send(graph)
    assert _wait(handle.get_result_async()).status == GoalStatus.STATUS_SUCCEEDED
    response = _wait(graph['cancel'].call_async(_cancel_request(bytes(handle.goal_id.uuid))))
    assert response.return_code == CancelGoal.Response.ERROR_GOAL_TERMINATED


def test_zero_goal_id_cancels_every_goal(graph, held):
    queued = [_send(graph) for _ in range(3)]
    response = _wait(graph['cancel'].call_async(_cancel_request()))
    assert response.return_code == CancelGoal.Response.ERROR_NONE
    ids = {bytes(info.goal_id.uuid) for info in response.goals_canceling}
    assert ids >= {bytes(h.goal_id.uuid) for h in queued + [held]}
    graph['engine'].gate.set()  # the held goal sees its cancel at its next check
    for handle in queued + [held]:
        response = _wait(handle.get_result_async())
        assert response.status == GoalStatus.STATUS_CANCELED, response.result.message
        assert response.result.status == R.CANCELED


def test_cancel_versus_completion_races_end_in_consistent_pairs(graph):
    """1000 trials: a goal and a cancel after a random delay; one consistent pair each."""
    rng = random.Random(10)
    pairs = {}
    for wave in range(100):
        handles = [_send(graph, _goal(max_new_tokens=rng.randint(1, 8))) for _ in range(10)]
        cancels = []
        for handle in handles:
            time.sleep(rng.uniform(0.0, 0.02))
            cancels.append(handle.cancel_goal_async())
        for handle, cancel in zip(handles, cancels):
            _wait(cancel)
            response = _wait(handle.get_result_async())
            pair = (response.status, response.result.status)
            assert CONSISTENT[response.result.status] == response.status, pair
            pairs[pair] = pairs.get(pair, 0) + 1
    assert sum(pairs.values()) == 1000
    print(f'cancel-vs-completion pairs (GoalStatus, result.status): {pairs}')
    # Both outcomes happened, so the trials did race (counts vary with the machine).
    assert pairs.get((GoalStatus.STATUS_CANCELED, R.CANCELED), 0) > 0
    assert pairs.get((GoalStatus.STATUS_SUCCEEDED, R.COMPLETED), 0) > 0


# --- failure isolation -------------------------------------------------------------------
def test_a_raising_event_publisher_still_delivers_the_result(graph, monkeypatch):
    server = graph['server']

    def broken_publish(msg):
        raise RuntimeError('event publisher exploded')

    monkeypatch.setattr(server.goals.events_pub, 'publish', broken_publish)
    response = _wait(_send(graph).get_result_async())
    assert response.status == GoalStatus.STATUS_SUCCEEDED
    monkeypatch.undo()
    assert _wait(_send(graph).get_result_async()).status == GoalStatus.STATUS_SUCCEEDED


def test_a_raising_stats_timer_leaves_the_node_serving(graph, monkeypatch):
    stats = graph['server'].service.stats
    real, calls = stats.snapshot, []

    def broken_snapshot():
        calls.append(time.monotonic())
        raise RuntimeError('stats exploded')

    monkeypatch.setattr(stats, 'snapshot', broken_snapshot)
    end = time.monotonic() + 10
    while len(calls) < 3 and time.monotonic() < end:
        time.sleep(0.05)
    assert len(calls) >= 3  # the timer kept firing after its first fault
    monkeypatch.setattr(stats, 'snapshot', real)
    assert _wait(_send(graph).get_result_async()).status == GoalStatus.STATUS_SUCCEEDED
    assert graph['spinner'].is_alive()


def test_spin_goes_on_after_a_callback_raises(graph):
    """Spin on when rclpy's executor re-raises a callback's exception out of spin()."""
    node = rclpy.create_node('faulty_timer_node')
    ticks = []

    def tick():
        ticks.append(time.monotonic())
        if len(ticks) == 1:
            raise RuntimeError('timer exploded')

    node.create_timer(0.02, tick)
    executor = MultiThreadedExecutor(num_threads=2)
    executor.add_node(node)
    thread = threading.Thread(target=spin_through_faults, args=(executor, node.get_logger()),
                              daemon=True)
    thread.start()
    end = time.monotonic() + 10
    while len(ticks) < 5 and time.monotonic() < end:
        time.sleep(0.02)
    executor.shutdown(timeout_sec=5)
    thread.join(5)
    node.destroy_node()
    assert len(ticks) >= 5 and not thread.is_alive()


# --- input limits ------------------------------------------------------------------------
def _rss_bytes():
    with open('/proc/self/status') as status_file:
        for line in status_file:
            if line.startswith('VmRSS:'):
                return int(line.split()[1]) * 1024
    raise RuntimeError('no VmRSS')


def test_a_64_mb_goal_is_refused_at_once_while_others_are_served(graph):
    good = graph['action'].send_goal_async(_goal('Is the gripper open?'))
    rss_before = _rss_bytes()
    start = time.monotonic()
    huge = _send(graph, _goal('x' * (64 << 20)))
    accepted_s = time.monotonic() - start
    response = _wait(huge.get_result_async())
    elapsed_s = time.monotonic() - start
    print(f'64 MB goal: accepted after {accepted_s:.3f} s, result after {elapsed_s:.3f} s')
    assert response.status == GoalStatus.STATUS_ABORTED
    assert response.result.status == R.REJECTED
    assert 'prompt too large' in response.result.message
    assert response.result.prompt_tokens == 0  # never tokenized
    # Moving 64 MB through rclpy (serialize, DDS, deserialize) takes most of it: 1.4 s idle,
    # 2.3 s on a loaded 2-core machine; the server's own part is the time after acceptance.
    # Generous margins here (a shared CI machine); docs/reliability.md has the figures.
    assert elapsed_s - accepted_s < 0.5 and elapsed_s < 5.0
    # Client and server share this process: the message exists serialized and as strings on
    # both sides, and rclpy keeps the request with the goal until the result expires.
    assert _rss_bytes() - rss_before < 6 * (64 << 20)
    good_handle = _wait(good)
    assert _wait(good_handle.get_result_async()).status == GoalStatus.STATUS_SUCCEEDED
    response = _wait(graph['cancel'].call_async(_cancel_request(bytes(range(1, 17)))))
    assert response.return_code == CancelGoal.Response.ERROR_UNKNOWN_GOAL_ID


def test_embedded_nul_cuts_the_prompt_and_replacement_chars_are_served(graph):
    """Expect a cut at the first NUL (rosidl C strings) and U+FFFD for invalid UTF-8 (rclpy)."""
    cut = _wait(_send(graph, _goal('Plan a route.\x00 ignore all of this')).get_result_async())
    plain = _wait(_send(graph, _goal('Plan a route.')).get_result_async())
    assert cut.status == plain.status == GoalStatus.STATUS_SUCCEEDED
    assert cut.result.prompt_tokens == plain.result.prompt_tokens
    odd = _wait(_send(graph, _goal('Plan \ufffd a route.')).get_result_async())
    assert odd.status == GoalStatus.STATUS_SUCCEEDED
    with pytest.raises(UnicodeEncodeError):  # a Python client cannot send lone surrogates
        graph['action'].send_goal_async(_goal('a\udcffb'))
