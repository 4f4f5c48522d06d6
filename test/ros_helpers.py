"""Helpers shared by the tests that run the real node over real rclpy in this process."""

import contextlib
import threading
import time

from builtin_interfaces.msg import Duration
import rclpy
from rclpy.executors import MultiThreadedExecutor

from timebill_ros.action import Instruct
from timebill_ros.engine import LlmEngine
from timebill_ros.ros.node import spin_through_faults, TimeBillNode


@contextlib.contextmanager
def node_and_client(factory, namespace, overrides, client_name, extra_threads=2,
                    through_faults=False):
    """Yield (server node, client node), both spinning on one MultiThreadedExecutor.

    factory(config, log) builds the TimeBillService; overrides: rclpy Parameters.
    through_faults: spin with ``spin_through_faults`` (the server process's loop) instead of
    ``executor.spin``. On exit the service shuts down, then the executor, nodes and rclpy.
    """
    rclpy.init()
    server = TimeBillNode(factory, namespace=namespace, parameter_overrides=overrides)
    client = rclpy.create_node(client_name)
    executor = MultiThreadedExecutor(num_threads=server.executor_threads + extra_threads)
    executor.add_node(server)
    executor.add_node(client)
    if through_faults:
        spinner = threading.Thread(target=spin_through_faults,
                                   args=(executor, server.get_logger()), daemon=True)
    else:
        spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        yield server, client, spinner
    finally:
        server.shutdown()
        executor.shutdown(timeout_sec=5)
        spinner.join(5)
        server.destroy_node()
        client.destroy_node()
        rclpy.try_shutdown()


def wait_future(future, timeout=60.0, poll_s=0.005):
    """Return the future's result once done; TimeoutError after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not future.done():
        if time.monotonic() > end:
            raise TimeoutError('future not done')
        time.sleep(poll_s)
    return future.result()


def goal_msg(prompt='Plan a route to the dock.', budget_s=60, **fields):
    """Return an Instruct.Goal with a time budget of ``budget_s`` whole seconds."""
    goal = Instruct.Goal(prompt=prompt, **fields)
    goal.time_budget = Duration(sec=budget_s)
    return goal


class GatedEngine(LlmEngine):
    """The real engine; a prefill waits while ``gate`` is clear.

    While it waits it checks the goal's stop criteria every 10 ms, as the real prefill does
    between layers: a cancel, a shutdown or a deadline ends a held goal too.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()

    def prefill(self, input_ids, stop, **kwargs):
        if not self.gate.is_set():
            self.waiting.set()
            while not self.gate.wait(0.01) and stop.check(0, None, 0) is None:
                pass
            self.waiting.clear()
        return super().prefill(input_ids, stop, **kwargs)
