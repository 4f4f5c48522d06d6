"""The node with engine.backend openai, over real rclpy, on a real llama.cpp server (loopback).

The node builds its service as `timebill serve` does (server/factory.py: tokenizer, start-up
probes through the API) and a plain rclpy ActionClient sends it goals.
"""

import threading
import time

from action_msgs.msg import GoalStatus
from builtin_interfaces.msg import Duration
import pytest
from rclpy.parameter import Parameter
from remote_helpers import complete, SERVER_CTX, start_llama_server
from ros_helpers import node_and_client, SpinningActionClient, wait_future

from timebill_ros.action import Instruct
from timebill_ros.ros.conversions import duration_to_s
from timebill_ros.server.factory import build_service

R = Instruct.Result
KILL, SKIP = Instruct.Goal.POLICY_KILL, Instruct.Goal.POLICY_SKIP_NEXT
PROMPT = 'Write a long, detailed story about a warehouse robot and its day at work.'


@pytest.fixture(scope='module')
def graph(tmp_path_factory):
    """Yield the llama.cpp server, the node on it and an action client."""
    llama = start_llama_server(tmp_path_factory)
    overrides = [Parameter('engine.backend', value='openai'),
                 Parameter('engine.remote_url', value=llama.url),
                 Parameter('engine.remote_context_tokens', value=SERVER_CTX),
                 Parameter('predictor.kind', value='fallback')]
    try:
        with node_and_client(build_service, 'fleet1', overrides, 'remote_planner') as (
                server, client, _):
            action = SpinningActionClient(client, Instruct, '/fleet1/timebill/instruct')
            assert action.wait_for_server(timeout_sec=20)
            yield {'llama': llama, 'action': action, 'server': server}
    finally:
        llama.stop()


def _goal(prompt=PROMPT, budget_s=5.0, policy=KILL, n_max=64):
    goal = Instruct.Goal(prompt=prompt, max_new_tokens=n_max, overrun_policy=policy)
    goal.time_budget = Duration(sec=int(budget_s), nanosec=int(budget_s % 1 * 1e9))
    return goal


def _run(graph, goal, feedback=None):
    handle = wait_future(graph['action'].send_goal_async(
        goal, feedback_callback=(lambda msg: feedback.append(msg.feedback)) if feedback
        is not None else None), 60)
    assert handle.accepted
    response = wait_future(handle.get_result_async(), 120)
    return response.status, response.result


def test_a_goal_completes_with_its_max_tokens_decision(graph):
    # 30 s for 48 tokens: N_max fits even if the start-up probes ran on a loaded machine
    # (5 s once gave max_tokens 35).
    feedback = []
    goal_status, result = _run(graph, _goal('Name three docks.', budget_s=30.0, n_max=48),
                               feedback)
    assert goal_status == GoalStatus.STATUS_SUCCEEDED
    assert result.status == R.COMPLETED, result.message
    assert result.deadline_met and result.response
    assert result.max_tokens_sent == 48
    execution_s = duration_to_s(result.total_time) - duration_to_s(result.queue_time)
    assert duration_to_s(result.predicted_wcet) >= execution_s
    assert any(f.phase == Instruct.Feedback.PHASE_DECODE and f.text for f in feedback)


def test_infeasible_goals_are_refused_at_once(graph):
    goal_status, result = _run(graph, _goal(budget_s=0.002))
    assert goal_status == GoalStatus.STATUS_ABORTED
    assert result.status == R.REJECTED and result.infeasible
    assert result.error_code == R.INFEASIBLE and result.max_tokens_sent == 0


def test_kill_lands_at_the_deadline_while_a_shared_server_is_busy(graph):
    # Another robot's request holds the one-request server: this goal's first token cannot
    # come before its deadline, and Kill ends the request there. The hold is 600 tokens that
    # ignore EOS (>= 1.5 s at llama.cpp's 2.5 ms a token): 160 that could stop at EOS were
    # once over before the goal's 1.1 s on a fast host, and the goal completed.
    other = threading.Thread(target=complete, args=(graph['llama'].url, PROMPT, 600, True),
                             daemon=True)
    other.start()
    time.sleep(0.3)
    goal_status, result = _run(graph, _goal('Say yes.', budget_s=0.8, n_max=8))
    other.join(60)
    assert result.status == R.KILLED, result.message
    assert result.error_code == R.DEADLINE
    late_s = duration_to_s(result.total_time) - 0.8
    assert 0 <= late_s <= 0.05, late_s


def test_a_stopped_server_fails_goals_and_the_node_serves_on_after_its_restart(graph):
    llama = graph['llama']
    llama.stop()
    goal_status, result = _run(graph, _goal('Say yes.', policy=SKIP, n_max=4))
    assert goal_status == GoalStatus.STATUS_ABORTED
    assert result.status == R.FAILED and result.error_code == R.REMOTE_UNREACHABLE, (
        result.message)
    llama.start()
    goal_status, result = _run(graph, _goal('Say yes.', budget_s=10.0, policy=SKIP, n_max=4))
    assert result.status == R.COMPLETED, result.message
