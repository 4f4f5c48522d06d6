"""The lifecycle node over real rclpy: transitions by ~/change_state, INACTIVE goals, the client.

Tiny random-weight model, real SmolLM2 tokenizer, real generated interfaces and the real
lifecycle services; the engine is held in its prefill (GatedEngine) to act while a goal runs.
"""

from action_msgs.msg import GoalStatus
from diagnostic_msgs.msg import DiagnosticArray
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState, GetState
import pytest
from rclpy.parameter import Parameter
from ros_helpers import GatedEngine, node_and_client, wait_for, wait_future, tiny_factory

from timebill_ros.action import Instruct
from timebill_ros.ros.client import TimebillClient
from timebill_ros.server import status

R = Instruct.Result


@pytest.fixture(scope='module')
def graph(tiny_model, smollm2_tokenizer):
    """Yield an unconfigured timebill node in /robot3, a client node and a TimebillClient."""
    factory = tiny_factory(tiny_model, smollm2_tokenizer, GatedEngine)
    overrides = [Parameter('engine.max_new_tokens', value=8),
                 Parameter('engine.feedback_every_tokens', value=1),
                 Parameter('stats.period_s', value=0.2)]
    with node_and_client(factory, 'robot3', overrides, 'lifecycle_manager',
                         activate=False) as (server, client, _):
        diag = []
        client.create_subscription(DiagnosticArray, '/diagnostics', diag.append, 10)
        services = {name: client.create_client(kind, f'/robot3/timebill/{name}')
                    for name, kind in (('get_state', GetState),
                                       ('change_state', ChangeState))}
        assert all(s.wait_for_service(timeout_sec=20) for s in services.values())
        with TimebillClient('/robot3/timebill/instruct', 'planner', wait_s=0) as llm:
            yield {'server': server, 'services': services, 'llm': llm,
                   'diag': diag, 'built': factory.built}


def _state(graph):
    response = wait_future(graph['services']['get_state'].call_async(GetState.Request()))
    return response.current_state.label


def _change(graph, transition_id):
    request = ChangeState.Request(transition=Transition(id=transition_id))
    return wait_future(graph['services']['change_state'].call_async(request), 120).success


def _ask(graph, prompt='Plan a route to the dock.'):
    return graph['llm'].ask(prompt, budget_s=60.0, timeout_s=120)


def _lifecycle_states_seen(graph):
    return {kv.value for msg in graph['diag'] for s in msg.status
            if s.name.startswith('timebill') for kv in s.values if kv.key == 'lifecycle_state'}


def test_an_unconfigured_node_has_no_action_server_yet(graph):
    assert _state(graph) == 'unconfigured'
    assert not graph['llm'].node.wait_for_server(1.0)
    wait_for(lambda: 'unconfigured' in _lifecycle_states_seen(graph), 10, 'diagnostics')


def test_configure_then_activate_serves_and_deactivate_refuses(graph):
    assert _change(graph, Transition.TRANSITION_CONFIGURE)
    assert _state(graph) == 'inactive'
    assert graph['llm'].node.wait_for_server(20)
    refused = _ask(graph)
    assert refused.status == R.REJECTED and refused.error_code == R.INACTIVE
    assert 'inactive' in refused.message and refused.finish_reason == 'rejected'
    assert _change(graph, Transition.TRANSITION_ACTIVATE)
    assert _state(graph) == 'active'
    served = _ask(graph)
    assert served.status == R.COMPLETED and served.error_code == R.NONE, served.message
    wait_for(lambda: 'active' in _lifecycle_states_seen(graph), 10, 'diagnostics')
    # deactivate with a goal running: it goes on to its end, new goals are refused
    engine = graph['built'][-1].engine
    engine.gate.clear()
    running = graph['llm'].send('Describe the dock.', budget_s=60.0)
    assert engine.waiting.wait(30)
    assert _change(graph, Transition.TRANSITION_DEACTIVATE)
    assert _state(graph) == 'inactive'
    refused = _ask(graph)
    assert refused.status == R.REJECTED and refused.error_code == R.INACTIVE
    engine.gate.set()
    assert running.result(60).status == R.COMPLETED
    assert running.goal_status == GoalStatus.STATUS_SUCCEEDED
    assert _change(graph, Transition.TRANSITION_ACTIVATE)
    assert _ask(graph).status == R.COMPLETED


def test_cleanup_ends_running_goals_with_shutdown_and_configure_reloads(graph):
    server, engine = graph['server'], graph['built'][-1].engine
    assert _state(graph) == 'active'
    engine.gate.clear()
    running = graph['llm'].send('Describe the dock.', budget_s=60.0)
    assert engine.waiting.wait(30)
    assert _change(graph, Transition.TRANSITION_DEACTIVATE)
    assert _change(graph, Transition.TRANSITION_CLEANUP)
    assert _state(graph) == 'unconfigured' and server.service is None
    ended = running.result(60)
    assert ended.status == R.FAILED and ended.error_code == R.SHUTDOWN
    assert running.goal_status == GoalStatus.STATUS_ABORTED
    refused = _ask(graph)  # the action server stays; the node has no model
    assert refused.status == R.REJECTED and refused.error_code == R.INACTIVE
    assert 'unconfigured' in refused.message
    engine.gate.set()
    assert _change(graph, Transition.TRANSITION_CONFIGURE)
    assert _change(graph, Transition.TRANSITION_ACTIVATE)
    assert graph['llm'].node.wait_for_server(20)
    assert len(graph['built']) == 2  # configure built a new service and engine
    assert _ask(graph).status == R.COMPLETED


def test_a_transition_the_state_does_not_allow_is_refused(graph):
    assert _state(graph) == 'active'
    assert not _change(graph, Transition.TRANSITION_CLEANUP)  # only from inactive
    assert _state(graph) == 'active'
    assert _ask(graph).status == R.COMPLETED


def test_the_client_sends_with_feedback_and_cancels(graph):
    engine = graph['built'][-1].engine
    heard = []
    engine.gate.clear()
    pending = graph['llm'].send('Describe the dock.', budget_s=60.0, on_feedback=heard.append)
    assert pending.accepted and engine.waiting.wait(30)
    assert pending.cancel()
    engine.gate.set()
    result = pending.result(60)
    assert result.status == R.CANCELED and result.error_code == R.NONE
    assert pending.goal_status == GoalStatus.STATUS_CANCELED
    assert heard and heard[0].phase == Instruct.Feedback.PHASE_QUEUED
    streamed = []
    done = graph['llm'].send('Say hi.', budget_s=60.0, on_feedback=streamed.append)
    assert done.result(60).status == R.COMPLETED
    assert ''.join(f.text for f in streamed) == done.result().response
    assert status.ERROR_CODES['INACTIVE'] == R.INACTIVE
