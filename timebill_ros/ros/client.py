"""Instruct action clients: :class:`TimebillClient` for planners, and the node under it.

A planner asks in three lines::

    from timebill_ros.ros.client import TimebillClient
    with TimebillClient() as llm:
        result = llm.ask('Which shelf holds the cups?', budget_s=2.0)

``result`` is the action's ``Instruct.Result``: ``status`` / ``error_code`` / ``message`` say
how the goal ended, ``response`` holds the answer. :meth:`TimebillClient.send` returns a
:class:`PendingGoal` at once, with feedback, ``cancel()`` and ``result()``.
"""

import contextlib
import threading

from rclpy.action import ActionClient
from rclpy.node import Node

from timebill_ros.action import Instruct
from timebill_ros.msg import ChatMessage
from timebill_ros.ros.conversions import s_to_duration
from timebill_ros.ros.goal_sender import GoalSender


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
        self.sender = GoalSender(self.action)
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
        self.sender.send(goal, feedback_callback=callback).add_done_callback(accepted)
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

    def finished(self, handle):
        """Return True once the result of a goal :meth:`send` sent has arrived."""
        future = self._results.get(bytes(handle.goal_id.uuid))
        return future is not None and future.done()

    def run(self, goal, on_feedback=None, timeout_s=600.0):
        """Send a goal and wait for its result; return (Instruct.Result, GoalStatus code)."""
        handle = self.send(goal, on_feedback)
        if handle is None or not handle.accepted:
            raise RuntimeError('goal was not accepted')
        return self.result(handle, timeout_s)


@contextlib.contextmanager
def client_session(action_name='/timebill/instruct', node_name='timebill_client'):
    """Yield a spinning InstructClient; shut the executor down and join it on exit.

    Sessions may nest (one per server): they share the rclpy context of the outermost.
    """
    with spinning(lambda: InstructClient(action_name, node_name)) as client:
        yield client


@contextlib.contextmanager
def spinning(make_node, threads=4, thread_name=None):
    """Yield the node ``make_node()`` spun by a MultiThreadedExecutor of ``threads`` threads.

    rclpy is initialised here when it is not yet (and shut down on exit then); on exit the
    executor is shut down, its thread joined and the node destroyed.
    """
    import rclpy
    from rclpy.executors import MultiThreadedExecutor

    own_context = not rclpy.ok()
    if own_context:
        rclpy.init()
    node = make_node()
    executor = MultiThreadedExecutor(num_threads=threads)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, name=thread_name, daemon=True)
    spinner.start()
    try:
        yield node
    finally:
        executor.shutdown(timeout_sec=5.0)
        spinner.join(timeout=5.0)
        node.destroy_node()
        if own_context:
            rclpy.try_shutdown()


class PendingGoal:
    """A goal sent by :meth:`TimebillClient.send`: its feedback, cancel and result.

    accepted: False when the server did not take it (it then has no result). feedback: the
    Instruct.Feedback messages so far (also passed to ``on_feedback`` as they come).
    """

    def __init__(self, node, handle, feedback):
        self._node, self._handle, self.feedback = node, handle, feedback
        self.accepted = handle is not None and handle.accepted
        self._response = None
        self._done = threading.Event()
        if self.accepted:
            future = node._results.pop(bytes(handle.goal_id.uuid))
            future.add_done_callback(self._on_result)

    def _on_result(self, future):
        self._response = future.result()
        self._done.set()

    def done(self):
        """Return True once the goal has its result."""
        return self._done.is_set()

    def cancel(self, timeout_s=10.0):
        """Ask the server to cancel the goal; return True when it accepted the request.

        The goal still ends with one result (CANCELED, or whatever came first).
        """
        if not self.accepted or self.done():
            return False
        answered = threading.Event()
        reply = {}

        def on_reply(future):
            reply['response'] = future.result()
            answered.set()

        self._handle.cancel_goal_async().add_done_callback(on_reply)
        if not answered.wait(timeout_s):
            return False
        return len(reply['response'].goals_canceling) > 0

    def result(self, timeout_s=None):
        """Block until the goal ends; return its Instruct.Result (TimeoutError after timeout_s)."""
        if not self.accepted:
            raise RuntimeError('the server did not accept the goal')
        if not self._done.wait(timeout_s):
            raise TimeoutError(f'no result within {timeout_s} s')
        return self._response.result

    @property
    def goal_status(self):
        """Return the action's GoalStatus code once done (STATUS_SUCCEEDED, ...), else None."""
        return self._response.status if self.done() else None


class TimebillClient:
    """A planner's client of the timebill server; rclpy is set up and spun inside.

    ``TimebillClient(action_name)`` waits up to ``wait_s`` seconds for the server
    (TimeoutError if none answers). Use it as a context manager, or call :meth:`close`.
    Goal fields are those of :func:`make_goal` (``max_new_tokens``, ``policy``, ``stop``,
    ``messages``, ``json_schema``, sampling, ...).
    """

    def __init__(self, action_name='/timebill/instruct', node_name='timebill_client',
                 wait_s=30.0):
        self._session = client_session(action_name, node_name)
        self.node = self._session.__enter__()
        if wait_s and not self.node.wait_for_server(wait_s):
            self.close()
            raise TimeoutError(f'no action server at {action_name} within {wait_s} s')

    @classmethod
    def attached(cls, node):
        """Return a client over an InstructClient that something else spins and closes."""
        client = cls.__new__(cls)
        client._session, client.node = None, node
        return client

    def send(self, prompt, budget_s, on_feedback=None, **fields) -> PendingGoal:
        """Send a goal with a time budget (seconds); return its PendingGoal at once."""
        feedback = []

        def keep(msg):
            feedback.append(msg)
            if on_feedback is not None:
                on_feedback(msg)

        handle = self.node.send(make_goal(prompt, budget_s=budget_s, **fields), keep)
        return PendingGoal(self.node, handle, feedback)

    def ask(self, prompt, budget_s, timeout_s=None, on_feedback=None, **fields):
        """Send a goal and block until it ends; return its Instruct.Result.

        ``timeout_s``: how long to wait for the result (None: the budget plus 60 s of
        transport slack; the server ends every goal by its deadline).
        """
        pending = self.send(prompt, budget_s, on_feedback=on_feedback, **fields)
        return pending.result(budget_s + 60.0 if timeout_s is None else timeout_s)

    def close(self):
        """Stop spinning and destroy the client node (rclpy is shut down if it started it)."""
        session, self._session = self._session, None
        if session is not None:
            session.__exit__(None, None, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
