"""GoalSender under concurrency, over real rclpy (issue 58).

Several threads send goals through one GoalSender while the goals' responses and results
arrive on the executor's threads, whose done-callbacks delete from the action client's
pending dicts without its lock. A send that iterated those dicts live raised "dictionary
changed size during iteration" 9-15 times in ~8,000 sends. A bare action server answers at
once, so the test exercises the client's bookkeeping, not a model: 2,000 goals in CI (~45 s on
2 cores), ``TIMEBILL_SENDER_GOALS=10000`` for the long run.
"""

import os
import threading

from action_msgs.msg import GoalStatus
import pytest
import rclpy
from rclpy.action import ActionClient, ActionServer
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.executors import MultiThreadedExecutor
from rclpy.qos import QoSProfile
from ros_helpers import goal_msg, wait_for, wait_future

from timebill_ros.action import Instruct
from timebill_ros.ros.goal_sender import GoalSender

N_GOALS = int(os.environ.get('TIMEBILL_SENDER_GOALS', '2000'))
N_THREADS = 4
WAVE = 25  # goals a thread has in flight at most
RESULT_TIMEOUT_S = 600
# The action's services keep this many requests (rclpy's default, 10, drops the rest of 100
# in flight: their results never come).
QOS = {name: QoSProfile(depth=1000) for name in (
    'goal_service_qos_profile', 'result_service_qos_profile', 'cancel_service_qos_profile')}


def _serve(goal_handle):
    goal_handle.succeed()
    return Instruct.Result(status=Instruct.Result.COMPLETED)


def _send_waves(sender, n_goals, faults, done):
    """Send ``n_goals`` goals in waves of WAVE; ask each result from its response's callback."""
    for start in range(0, n_goals, WAVE):
        finished = threading.Semaphore(0)
        count = min(WAVE, n_goals - start)

        def on_result(future):
            done.append(future.result().status)
            finished.release()

        def on_response(future):
            future.result().get_result_async().add_done_callback(on_result)

        for _ in range(count):
            try:
                sender.send(goal_msg('x', 60)).add_done_callback(on_response)
            except Exception as exc:  # what the race raised out of send()
                faults.append(repr(exc))
                finished.release()
        for _ in range(count):
            if not finished.acquire(timeout=30):
                faults.append('a result did not come')
                return


@pytest.fixture
def bare():
    """Yield (action client, node) on a bare action server, spun by 4 executor threads."""
    rclpy.init()
    node = rclpy.create_node('goal_sender_test')
    group = ReentrantCallbackGroup()
    # Results kept RESULT_TIMEOUT_S (rclpy's default, 10 s, expired goals whose result request
    # a loaded machine's executor had not yet handled: STATUS_UNKNOWN).
    server = ActionServer(node, Instruct, 'sender_test', _serve, callback_group=group,
                          result_timeout=RESULT_TIMEOUT_S, **QOS)
    # The client runs on one executor thread at a time, as a planner's (TimebillClient) does:
    # rclpy's ActionClient.execute on two threads at once deletes a finished goal's handle
    # twice (KeyError, which ended the executor's spin in one of ten runs).
    action = ActionClient(node, Instruct, 'sender_test',
                          callback_group=MutuallyExclusiveCallbackGroup(), **QOS)
    executor = MultiThreadedExecutor(num_threads=4)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        assert action.wait_for_server(timeout_sec=20)
        yield action
    finally:
        executor.shutdown(timeout_sec=5)
        spinner.join(5)
        action.destroy()
        server.destroy()
        node.destroy_node()
        rclpy.try_shutdown()


def test_threads_sending_while_results_arrive_raise_nothing_and_leak_nothing(bare):
    sender = GoalSender(bare)
    assert sender.own_send  # rclpy 9.1.2's layout: the send this test is about
    faults, done = [], []
    threads = [threading.Thread(target=_send_waves,
                                args=(sender, N_GOALS // N_THREADS, faults, done))
               for _ in range(N_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert faults == [], faults[:5]
    assert len(done) == N_GOALS // N_THREADS * N_THREADS
    assert set(done) == {GoalStatus.STATUS_SUCCEEDED}
    wait_for(lambda: sender.tracked_futures() == 0, 10,
             f'{sender.tracked_futures()} futures kept after {len(done)} goals')


class _SwitchAfterRelease:
    """The client's lock; the sending thread's first release waits for the goal response.

    What a thread switch at the worst moment does: the executor takes and handles the goal
    response right after the send left the lock. rclpy 9.1.2's send_goal_async registers its
    returned future only after that point, so its response went to the other future and the
    returned one never completed (10 s here); GoalSender's send has registered it already.
    """

    def __init__(self, action):
        self.lock, self.action = action._lock, action
        self.sender_thread, self.switched = threading.get_ident(), False

    def acquire(self, *args, **kwargs):
        return self.lock.acquire(*args, **kwargs)

    def release(self):
        self.lock.release()
        if threading.get_ident() == self.sender_thread and not self.switched:
            self.switched = True
            wait_for(lambda: not self.action._pending_goal_requests, 10,
                     'the executor did not handle the goal response')

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc_info):
        self.release()


def test_a_goal_response_handled_right_after_the_send_reaches_the_returned_future(bare):
    sender = GoalSender(bare)
    bare._lock = _SwitchAfterRelease(bare)
    future = sender.send(goal_msg('x', 60))
    assert bare._lock.switched
    assert wait_future(future, timeout=10).accepted
    wait_for(lambda: sender.tracked_futures() == 0, 10,
             f'{sender.tracked_futures()} futures kept after one goal')
