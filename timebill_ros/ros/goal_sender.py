"""Sending action goals without rclpy's per-goal future leak and its lost-response race.

rclpy's ``ActionClient.send_goal_async`` (9.1.2, the Kilted wheels; the same backport reached
other distributions, ros2/rclpy#1519) registers the goal-response future twice: once under
the client's lock, right after the request is sent, and once more after the lock is released.

- **Leak.** Both futures go into the client's waitable ``_futures`` list; only the second is
  ever completed and removed (fixed upstream by ros2/rclpy#1532). The executor walks the whole
  list each time the action client has data, so a long-lived client slows down goal by goal:
  measured here with a bare action server, the goal-response p50 went 2.6 -> 5.4 ms over 4000
  goals, and a fresh client on the same server started again at 1.9 ms.
- **Race.** A server that answers before the sending thread reaches the second registration
  completes the *first* future; the second, the one returned, then waits for a response that
  already came. Seen once in 10 runs of 10,000 goals from 4 threads on a bare server
  (test_goal_sender.py); ``test_ros_load.py`` forces it.

:class:`GoalSender` therefore registers the one future itself, under the client's lock, in the
same call that sends the request (what the fixed upstream does), through the client's
attributes that 9.1.2 has. A client without them (another rclpy layout) gets the plain
``send_goal_async``.
"""

from rclpy.task import Future

# What GoalSender's own send uses of rclpy's ActionClient (9.1.2's layout).
CLIENT_ATTRIBUTES = ('_lock', '_client_handle', '_action_type', '_pending_goal_requests',
                     '_goal_sequence_number_to_goal_id', '_remove_pending_goal_request',
                     '_feedback_callbacks', '_generate_random_uuid', 'add_future', '_futures')


class GoalSender:
    """Sends goals on one ``rclpy.action.ActionClient``; every goal of that client goes through.

    ``own_send``: True when the client has the layout :func:`send` registers its future in
    (CLIENT_ATTRIBUTES); False: ``send_goal_async`` as it is.
    """

    def __init__(self, action):
        self.action = action
        self.own_send = all(hasattr(action, name) for name in CLIENT_ATTRIBUTES)

    def send(self, goal, feedback_callback=None):
        """Send ``goal``; return the future of its goal handle (as ``send_goal_async``'s).

        Raises TypeError when ``goal`` is not the action's Goal type.
        """
        if not self.own_send:
            return self.action.send_goal_async(goal, feedback_callback=feedback_callback)
        action = self.action
        if not isinstance(goal, action._action_type.Goal):
            raise TypeError(f'goal must be a {action._action_type.__name__}.Goal, '
                            f'got {type(goal).__name__}')
        request = action._action_type.Impl.SendGoalService.Request()
        request.goal_id, request.goal = action._generate_random_uuid(), goal
        future = Future()
        # The response is taken under the same lock (ActionClient.take_data): it finds the
        # future registered, whichever thread runs first.
        with action._lock:
            if feedback_callback is not None:
                action._feedback_callbacks[bytes(request.goal_id.uuid)] = feedback_callback
            sequence_number = action._client_handle.send_goal_request(request)
            if sequence_number in action._pending_goal_requests:
                raise RuntimeError(f'goal request sequence number {sequence_number} is '
                                   'already pending')
            action._pending_goal_requests[sequence_number] = future
            action._goal_sequence_number_to_goal_id[sequence_number] = request.goal_id
            future.add_done_callback(action._remove_pending_goal_request)
            action.add_future(future)
        return future

    def tracked_futures(self) -> int:
        """Return how many futures the action client's waitable holds (0 if it has no list)."""
        futures = getattr(self.action, '_futures', None)
        return len(futures) if isinstance(futures, list) else 0
