"""The Instruct action's mechanics: accept, execute, cancel and end each goal.

nav2 keeps the action mechanics in a reusable wrapper so that its servers hold only the task;
:class:`InstructGoals` is that wrapper here. It owns the rclpy ActionServer and the goal
bookkeeping (the job of each waiting execute callback, cancels that came before their job,
callbacks in flight); the node (ros/node.py) owns the lifecycle and the service.

Long work runs on the service's executor threads. Each goal's execute callback only waits for
its result on a threading.Event, so the MultiThreadedExecutor gets a thread for every goal that
may be queued or running (the node's ``executor_threads``).
"""

import threading
import time

from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

from timebill_ros.action import Instruct
from timebill_ros.ros import conversions
from timebill_ros.server import status
from timebill_ros.server.goals import JobResult

WAIT_SLICE_S = 1.0  # how often a waiting execute callback checks the server's threads, s
CANCELING_WAIT_S = 2.0  # longest wait for rclpy's CANCELING transition, s
EARLY_CANCEL_KEEP_S = 60.0  # how long a cancel that came before its goal's job is kept, s


class InstructGoals:
    """Serves the Instruct action of ``node`` through whatever service ``node.slot`` holds.

    node: the TimeBillNode (its slot, lifecycle_state, clock and logger); events_pub: the
    GoalEvent publisher every ended goal is announced on; log_fault(where): logs the
    exception being handled (the node's).
    """

    def __init__(self, node, events_pub, callback_group, log_fault):
        self.node = node
        self._log_fault = log_fault
        self.events_pub = events_pub
        self.callback_group = callback_group
        self.action = None  # the ActionServer, once opened
        self.jobs = {}  # goal id bytes -> Job, while its execute callback waits
        self.early_cancels = {}  # goal id bytes -> monotonic s: canceled before submitted
        self.jobs_lock = threading.Lock()
        self.executing = 0  # execute callbacks that have not returned yet
        self._executing_cond = threading.Condition()

    def open(self, ros_config):
        """Open the action server (``ros_config``: the ``ros`` group); it stays open after."""
        self.action = ActionServer(
            self.node, Instruct, ros_config.action_name, execute_callback=self.execute,
            goal_callback=self.on_goal, cancel_callback=self.on_cancel,
            callback_group=self.callback_group, handle_accepted_callback=self.on_accepted,
            result_timeout=ros_config.result_timeout_s,
            **_service_qos(ros_config.request_queue_depth))

    def close(self, wait_s):
        """Give execute callbacks up to ``wait_s`` seconds to return; destroy the server."""
        with self._executing_cond:
            self._executing_cond.wait_for(lambda: self.executing == 0, wait_s)
        if self.action is not None:
            self.action.destroy()

    # --- rclpy's callbacks -----------------------------------------------------------------
    def on_goal(self, goal_request):
        """Accept every goal, so that bad input ends in a REJECTED result with a reason."""
        return GoalResponse.ACCEPT

    def on_accepted(self, goal_handle):
        """Start the goal's execute callback, also when a cancel races rclpy's execute().

        ``ServerGoalHandle.execute()`` checks ``is_cancel_requested`` and then moves the goal
        to EXECUTING without a lock. A cancel processed on another executor thread in between
        makes that transition raise (CANCELING -> EXECUTE is invalid) before the execute
        callback is scheduled, and the goal would never get a result. Found by
        bench/studies/responsiveness.py (a cancel sent as soon as the goal was accepted).
        """
        try:
            goal_handle.execute()
        except Exception:
            if not goal_handle.is_cancel_requested:
                raise
            if self.action is not None:
                self.action.notify_execute(goal_handle, None)  # ends it CANCELED

    def on_cancel(self, goal_handle):
        """Cancel the goal's job; remember the cancel when the job is not submitted yet.

        rclpy moves the goal to CANCELING only after this callback returns, so an execute
        callback that submits the job meanwhile sees ``is_cancel_requested`` still false:
        ``early_cancels`` carries the cancel to it (a lost cancel let a goal run to the end).
        """
        try:
            key = bytes(goal_handle.goal_id.uuid)
            with self.jobs_lock:
                job = self.jobs.get(key)
                if job is None:
                    now_s = time.monotonic()
                    self.early_cancels = {k: t for k, t in self.early_cancels.items()
                                          if now_s - t < EARLY_CANCEL_KEEP_S}
                    self.early_cancels[key] = now_s
            service = self.node.service
            if job is not None and service is not None:
                service.cancel(job)
        except Exception:  # the request is still answered; the goal ends on its own
            self._log_fault('cancel callback')
        return CancelResponse.ACCEPT

    def execute(self, goal_handle):
        """Run one goal to its Instruct.Result (rclpy's execute callback)."""
        with self._executing_cond:
            self.executing += 1
        try:
            return self._execute_goal(goal_handle)
        finally:
            with self._executing_cond:
                self.executing -= 1
                self._executing_cond.notify_all()

    # --- one goal --------------------------------------------------------------------------
    def _execute_goal(self, goal_handle):
        node = self.node
        key = bytes(goal_handle.goal_id.uuid)
        ros_now_s = node.get_clock().now().nanoseconds / 1e9
        clock_of = node.service
        mono_now_s = clock_of.clock() if clock_of is not None else time.monotonic()
        request = conversions.request_from_goal(
            goal_handle.request, key.hex(), ros_now_s, mono_now_s)
        received_s = mono_now_s - max(0.0, ros_now_s - _accepted_at_s(goal_handle, ros_now_s))
        finished = threading.Event()
        outcome = {}

        def on_feedback(feedback):
            goal_handle.publish_feedback(conversions.feedback_to_msg(feedback))

        def on_done(result):
            outcome['result'] = result
            try:
                self.events_pub.publish(
                    conversions.event_msg(result, node.get_clock().now().to_msg()))
            except Exception:  # the event is a side line: the result still goes out
                self._log_fault('event publishing')
            finally:
                finished.set()

        early = node.service
        if early is not None and request.json_schema:
            early.precompile(request, received_s)  # outside the lock: it may take a while
        with node.slot.lock:  # a replacement service is never swapped in mid-submit
            service = node.service
            if service is not None:
                job = service.submit(request, on_feedback, on_done, received_s=received_s)
        if service is None:  # unconfigured (after a cleanup)
            on_done(JobResult(
                status=status.REJECTED, error_code=status.ERROR_INACTIVE, goal_id=key.hex(),
                message=f'server is {node.lifecycle_state} (lifecycle state); configure and '
                        'activate it', finish_reason=status.FINISH_REJECTED,
                budget_s=request.budget_s or 0.0, stop_phase='admission'))
            return self._terminate(goal_handle, outcome['result'])
        with self.jobs_lock:
            if job is not None:
                self.jobs[key] = job
            canceled_early = self.early_cancels.pop(key, None) is not None
        if job is not None and (canceled_early or goal_handle.is_cancel_requested):
            service.cancel(job)
        self._wait_finished(service, finished, outcome, goal_handle, job)
        with self.jobs_lock:
            self.jobs.pop(key, None)
        return self._terminate(goal_handle, outcome['result'])

    def _wait_finished(self, service, finished, outcome, goal_handle, job):
        """Wait for the goal's result; a FAILED one if the server's threads died meanwhile.

        Every WAIT_SLICE_S it also applies a cancel rclpy holds that the job missed.
        """
        while not finished.wait(WAIT_SLICE_S):
            if job is not None and goal_handle.is_cancel_requested:
                service.cancel(job)
            if not service.healthy:
                outcome.setdefault('result', JobResult(
                    status=status.FAILED, stop_phase='server',
                    error_code=status.ERROR_INTERNAL, finish_reason=status.FINISH_ERROR,
                    message='internal error: a server thread died; see the node log'))
                return

    def _terminate(self, goal_handle, result):
        # The message first: a goal marked done with no result message reaches the client as
        # an empty Result (status 0).
        result, msg = self._result_msg(result)
        outcome = status.ACTION_OUTCOME[result.status]
        if outcome == 'canceled':
            # A goal canceled while queued ends inside the cancel callback, before rclpy
            # moves it to CANCELING (after the callback returns): wait for that transition.
            _wait_until(lambda: goal_handle.is_cancel_requested, CANCELING_WAIT_S)
        if outcome == 'canceled' and goal_handle.is_cancel_requested:
            goal_handle.canceled()
        elif outcome == 'succeed':
            goal_handle.succeed()
        else:
            goal_handle.abort()
        line = (f'goal {result.goal_id[:8]}: {result.status_name} ({result.message}) '
                f'total {result.total_time_s:.3f} s')
        # rclpy refuses different severities from one call site: two calls.
        if result.status == status.COMPLETED:
            self.node.get_logger().info(line)
        else:
            self.node.get_logger().warning(line)
        return msg

    def _result_msg(self, result):
        """Return ``(result, its Instruct.Result)``, never raising.

        A result that cannot be converted (a non-finite time, a field of the wrong type) goes
        out with its non-finite times as 0 and a note; if even that fails, as FAILED with
        ``ERROR_INTERNAL`` naming the fault. Either way the fault is logged.
        """
        try:
            return result, conversions.result_to_msg(result)
        except Exception:
            self._log_fault(f'goal {result.goal_id[:8]}: result conversion')
        try:
            cleaned = conversions.finite_times(result)
            return cleaned, conversions.result_to_msg(cleaned)
        except Exception as exc:
            failed = JobResult(
                status=status.FAILED, error_code=status.ERROR_INTERNAL, goal_id=result.goal_id,
                finish_reason=status.FINISH_ERROR, stop_phase='server',
                message=f'internal error: the result could not be sent: '
                        f'{type(exc).__name__}: {exc}')
            return failed, conversions.result_to_msg(failed)


def _service_qos(depth):
    """Return the ActionServer QoS keywords: reliable keep-last queues of ``depth`` requests."""
    profile = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth,
                         reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.VOLATILE)
    return {f'{name}_service_qos_profile': profile for name in ('goal', 'cancel', 'result')}


def _wait_until(predicate, timeout_s, poll_s=0.002):
    """Poll ``predicate`` until it is true or ``timeout_s`` seconds pass; return its value."""
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= end:
            return False
        time.sleep(poll_s)
    return True


def _accepted_at_s(goal_handle, default_s):
    """Return the ROS time (s) the action server stamped when it accepted the goal.

    rclpy keeps it in the handle's GoalInfo (``_goal_info``, the same from Humble to Kilted)
    without a public accessor. Execute callbacks run on parallel threads and may start out of
    order, so this stamp, not the callback's start, is the goal's receipt time.
    """
    info = getattr(goal_handle, '_goal_info', None)
    stamp = getattr(info, 'stamp', None)
    if stamp is None or (stamp.sec == 0 and stamp.nanosec == 0):
        return default_s
    return conversions.time_to_s(stamp)
