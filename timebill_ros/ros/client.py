"""A small Instruct action client, for the CLI, the demo, the benchmark and tests."""

import threading

from rclpy.action import ActionClient
from rclpy.node import Node

from timebill_ros.action import Instruct
from timebill_ros.msg import ChatMessage
from timebill_ros.ros.conversions import s_to_duration


def make_goal(prompt, budget_s=0.0, deadline=None, max_new_tokens=0, policy=0,
              system_prompt='', stop=(), messages=(), temperature=0.0, top_p=0.0, top_k=0,
              repetition_penalty=0.0, seed=0, json_schema=''):
    """Return an Instruct.Goal; budget_s in seconds (0 = use ``deadline``, a ROS Time msg).

    stop: strings that end the answer (the response stops before the first one).
    messages: an earlier conversation, ``(role, content)`` pairs. temperature (0 = greedy),
    top_p, top_k, repetition_penalty, seed: sampling, as in Instruct.action (0 = default).
    json_schema: a JSON schema text the answer must be valid against ('' = free text).
    """
    goal = Instruct.Goal(prompt=prompt, system_prompt=system_prompt,
                         max_new_tokens=max_new_tokens, overrun_policy=policy, stop=list(stop),
                         messages=[ChatMessage(role=role, content=content)
                                   for role, content in messages],
                         temperature=float(temperature), top_p=float(top_p), top_k=int(top_k),
                         repetition_penalty=float(repetition_penalty), seed=int(seed),
                         json_schema=json_schema)
    goal.time_budget = s_to_duration(budget_s)
    if deadline is not None:
        goal.deadline = deadline
    return goal


class InstructClient(Node):
    """Sends Instruct goals and waits for their results (needs a spinning executor)."""

    def __init__(self, action_name='/timebill/instruct', node_name='timebill_client'):
        super().__init__(node_name)
        self.action = ActionClient(self, Instruct, action_name)
        self._results = {}

    def wait_for_server(self, timeout_s=30.0):
        """Return True once the action server is available."""
        return self.action.wait_for_server(timeout_sec=timeout_s)

    def send(self, goal, on_feedback=None, timeout_s=60.0):
        """Send a goal and block until it is accepted; return the goal handle (or None).

        The result is requested at once (servers keep finished results only for
        ``result_timeout``, 10 s by default on Kilted); :meth:`result` waits for it.
        """
        ready = threading.Event()
        holder = {}

        def accepted(future):
            handle = future.result()
            if handle.accepted:
                self._results[bytes(handle.goal_id.uuid)] = handle.get_result_async()
            holder['handle'] = handle
            ready.set()

        callback = (lambda msg: on_feedback(msg.feedback)) if on_feedback else None
        self.action.send_goal_async(goal, feedback_callback=callback).add_done_callback(
            accepted)
        if not ready.wait(timeout_s):
            return None
        return holder['handle']

    def result(self, handle, timeout_s=600.0):
        """Block until the goal's result arrives; return (Instruct.Result, GoalStatus code)."""
        future = self._results.pop(bytes(handle.goal_id.uuid))
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        if not done.wait(timeout_s):
            raise TimeoutError(f'no result within {timeout_s} s')
        response = future.result()
        return response.result, response.status

    def run(self, goal, on_feedback=None, timeout_s=600.0):
        """Send a goal and wait for its result; return (Instruct.Result, GoalStatus code)."""
        handle = self.send(goal, on_feedback)
        if handle is None or not handle.accepted:
            raise RuntimeError('goal was not accepted')
        return self.result(handle, timeout_s)
