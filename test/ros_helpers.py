"""Helpers shared by the tests that run the real node over real rclpy in this process."""

import contextlib
import threading
import time

from action_msgs.msg import GoalStatus
from builtin_interfaces.msg import Duration
import rclpy
from rclpy.action import ActionClient
from rclpy.executors import MultiThreadedExecutor

from timebill_ros.action import Instruct
from timebill_ros.engine import LlmEngine
from timebill_ros.ros.node import TimeBillNode
from timebill_ros.ros.spin import bring_up, spin_through_faults
from timebill_ros.timing.model import TimingCoefficients

# Time-model coefficients that make every goal feasible on the tiny models, seconds.
COEFFS = TimingCoefficients(a=1e-9, b=1e-5, c=1e-3, p=1e-6, q=1e-3)
R = Instruct.Result
# The one GoalStatus each terminal result status may reach the client with.
CONSISTENT = {R.COMPLETED: GoalStatus.STATUS_SUCCEEDED, R.CANCELED: GoalStatus.STATUS_CANCELED,
              R.KILLED: GoalStatus.STATUS_ABORTED, R.SKIPPED: GoalStatus.STATUS_ABORTED,
              R.REJECTED: GoalStatus.STATUS_ABORTED, R.FAILED: GoalStatus.STATUS_ABORTED}


class SpinningActionClient(ActionClient):
    """An rclpy ActionClient that may be made while its node's executor spins.

    rclpy 9.1.2's ActionClient adds itself to its node's waitables before it makes its lock:
    an executor spinning on another thread meanwhile calls ``get_num_entities``, which takes
    the lock, and its spin thread dies of an AttributeError (no goal response ever after;
    seen once in a fresh clone's ``make test``). The lock made first closes that window.
    """

    def __init__(self, node, action_type, action_name, **kwargs):
        """Make the lock, then the client (rclpy makes its own lock again at the end)."""
        self._lock = threading.Lock()
        super().__init__(node, action_type, action_name, **kwargs)


@contextlib.contextmanager
def node_and_client(factory, namespace, overrides, client_name, extra_threads=2,
                    through_faults=False, activate=True, **node_kwargs):
    """Yield (server node, client node), both spinning on one MultiThreadedExecutor.

    factory(config, log) builds the TimeBillService; overrides: rclpy Parameters.
    activate: configure and activate the server first (else it stays unconfigured).
    node_kwargs: more TimeBillNode arguments; ``upgrade_check`` defaults to "nothing new", so
    predictor files in this machine's cache never make a test node rebuild its service.
    through_faults: spin with ``spin_through_faults`` (the server process's loop) instead of
    ``executor.spin``. On exit the service shuts down, then the executor, nodes and rclpy.
    """
    rclpy.init()
    node_kwargs.setdefault('upgrade_check', lambda service: None)
    server = TimeBillNode(factory, namespace=namespace, parameter_overrides=overrides,
                          **node_kwargs)
    if activate:
        assert bring_up(server), 'the node did not come up'
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


def tiny_factory(model, tokenizer, engine_cls=LlmEngine, predictors=None):
    """Return a service factory(config, log) on ``model`` with the fallback predictor.

    engine_cls: LlmEngine or GatedEngine. predictors: a list of LengthPredictors, one taken
    for each service built (then the fallback); built services are appended to
    ``factory.built``.
    """
    from timebill_ros.predictors import FallbackPredictor
    from timebill_ros.server.service import TimeBillService

    def factory(config, log):
        engine = engine_cls(config.engine, config.eviction, model=model, tokenizer=tokenizer)
        predictor = predictors.pop(0) if predictors else FallbackPredictor()
        service = TimeBillService(config, engine, predictor, COEFFS)
        factory.built.append(service)
        return service

    factory.built = []
    return factory


def wait_future(future, timeout=60.0, poll_s=0.005):
    """Return the future's result once done; TimeoutError after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not future.done():
        if time.monotonic() > end:
            raise TimeoutError('future not done')
        time.sleep(poll_s)
    return future.result()


def wait_for(predicate, timeout_s, what):
    """Poll ``predicate`` every 10 ms; TimeoutError(``what``) after ``timeout_s`` seconds."""
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError(what)
        time.sleep(0.01)


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
