"""A client that streams goals: sent without blocking, their timings, lifecycle transitions.

Where ros/client.py's TimebillClient waits for each answer, :class:`StreamClient` keeps many
goals in flight (a load test, a planner that fires and forgets): it turns plain fields into
an ``Instruct.Goal`` (bad ones included, sent as they are: a negative budget, a NaN
temperature, for testing the server's checks), sends it with a callback for the goal
response and one for the result, cancels it, and asks the node's ``~/change_state`` for
deactivate / activate. Every time it reports is ``time.monotonic()`` seconds, taken in the
callback that saw the event. ``timebill soak`` (bench/soak.py) drives it.
"""

import contextlib
import math
import threading
import time

from builtin_interfaces.msg import Duration
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState
from rclpy.action import ActionClient
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

from timebill_ros.action import Instruct
from timebill_ros.msg import ChatMessage
from timebill_ros.ros.client import spinning
from timebill_ros.ros.conversions import NS_PER_S
from timebill_ros.ros.goal_sender import GoalSender

REQUEST_QUEUE_DEPTH = 1000  # goal / cancel / result responses kept before the oldest is lost
TRANSITIONS = {'activate': Transition.TRANSITION_ACTIVATE,
               'deactivate': Transition.TRANSITION_DEACTIVATE}


def raw_duration(seconds):
    """Return a Duration message of ``seconds``, negatives kept (sec < 0, nanosec >= 0).

    A load test sends negative budgets on purpose; ``conversions.s_to_duration`` clamps them.
    ValueError for a non-finite number (a Duration holds integers: NaN cannot be sent).
    """
    if not math.isfinite(seconds):
        raise ValueError(f'a Duration needs a finite number of seconds, got {seconds!r}')
    total_ns = int(round(seconds * NS_PER_S))
    return Duration(sec=total_ns // NS_PER_S, nanosec=total_ns % NS_PER_S)


def goal_message(spec):
    """Return the Instruct.Goal of plain fields (a dict, e.g. ``bench.soak.GoalSpec``'s).

    Keys used: prompt, system_prompt, messages ([(role, content)]), json_schema, budget_s
    (seconds, sent as is: negative or zero too), policy, max_new_tokens, temperature.
    """
    goal = Instruct.Goal(
        prompt=spec['prompt'], system_prompt=spec['system_prompt'],
        messages=[ChatMessage(role=role, content=content) for role, content in spec['messages']],
        json_schema=spec['json_schema'], overrun_policy=int(spec['policy']),
        max_new_tokens=int(spec['max_new_tokens']), temperature=float(spec['temperature']))
    goal.time_budget = raw_duration(spec['budget_s'])
    return goal


class SentGoal:
    """One goal in flight: its handle once accepted, and a cancel that may come before it."""

    def __init__(self):
        self.handle = None
        self.cancel_wanted = False
        self.lock = threading.Lock()


class StreamClient(Node):
    """Sends Instruct goals to ``/<server>/instruct`` without waiting; needs a spinning executor.

    Its goal, cancel and result queues are ``REQUEST_QUEUE_DEPTH`` deep, like the server's, so
    a burst of responses is not dropped on this side.
    """

    def __init__(self, server_name, node_name):
        super().__init__(node_name)
        group = ReentrantCallbackGroup()
        profile = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=REQUEST_QUEUE_DEPTH,
                             reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.VOLATILE)
        # The action client in a group of its own, run on one thread at a time: rclpy 9.1.2's
        # ActionClient.execute is not safe on two threads at once (two status messages of a
        # finished goal delete its handle twice; the KeyError ends the executor's spin).
        self.action = ActionClient(
            self, Instruct, f'/{server_name}/instruct',
            callback_group=MutuallyExclusiveCallbackGroup(),
            **{f'{name}_service_qos_profile': profile for name in ('goal', 'cancel', 'result')})
        self.sender = GoalSender(self.action)
        self.lifecycle = self.create_client(ChangeState, f'/{server_name}/change_state',
                                            callback_group=group)

    def wait_for_server(self, timeout_s):
        """Return True once the action server answers (waits up to ``timeout_s`` seconds)."""
        return self.action.wait_for_server(timeout_sec=timeout_s)

    def send(self, goal, on_response, on_result):
        """Send ``goal``; return its SentGoal at once.

        on_response(time_s, accepted): when the goal response arrives. on_result(time_s,
        result, goal_status): when the result arrives (accepted goals only); ``result`` is
        the Instruct.Result, ``goal_status`` the action's GoalStatus code.
        """
        sent = SentGoal()

        def result_arrived(future):
            response = future.result()
            on_result(time.monotonic(), response.result, int(response.status))

        def response_arrived(future):
            now = time.monotonic()
            handle = future.result()
            on_response(now, bool(handle.accepted))
            if not handle.accepted:
                return
            handle.get_result_async().add_done_callback(result_arrived)
            with sent.lock:
                sent.handle = handle
                cancel = sent.cancel_wanted
            if cancel:
                handle.cancel_goal_async()

        self.sender.send(goal).add_done_callback(response_arrived)
        return sent

    def cancel(self, sent):
        """Ask the server to cancel ``sent`` (at once, or as soon as it is accepted)."""
        with sent.lock:
            sent.cancel_wanted = True
            handle = sent.handle
        if handle is not None:
            handle.cancel_goal_async()

    def change_state(self, transition, timeout_s=30.0):
        """Ask for lifecycle ``transition`` ('activate' or 'deactivate'); return its success.

        False when the service does not answer within ``timeout_s`` seconds.
        """
        if transition not in TRANSITIONS:
            raise ValueError(f'transition must be one of {sorted(TRANSITIONS)}, '
                             f'got {transition!r}')
        if not self.lifecycle.wait_for_service(timeout_sec=timeout_s):
            return False
        request = ChangeState.Request()
        request.transition.id = TRANSITIONS[transition]
        done = threading.Event()
        future = self.lifecycle.call_async(request)
        future.add_done_callback(lambda _: done.set())
        if not done.wait(timeout_s):
            return False
        return bool(future.result().success)


@contextlib.contextmanager
def stream_session(server_name, node_name='timebill_stream_client', threads=4):
    """Yield a StreamClient spun by a MultiThreadedExecutor of ``threads`` threads.

    rclpy is initialised here when it is not yet, and shut down on exit then.
    """
    with spinning(lambda: StreamClient(server_name, node_name), threads,
                  thread_name='stream-spin') as client:
        yield client
