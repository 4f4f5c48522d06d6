"""The ``timebill`` node: a managed (lifecycle) Instruct action server over TimeBillService.

Lifecycle (``rclpy.lifecycle``; ``~/get_state``, ``~/change_state``):

- unconfigured, before the first configure: no action server yet (a client's
  ``wait_for_server`` waits, as for a node that has not started); /diagnostics says so.
- configure: reads the parameters, loads the model, calibrates, loads the predictors and
  warms up (the service factory); the first one opens the action server, which then stays
  open for the node's life. inactive: every new goal ends REJECTED with ``INACTIVE``.
- activate: goals are served. deactivate: new goals end REJECTED with ``INACTIVE``; queued
  and running goals go on to their own terminal state (each has a deadline).
- cleanup: every queued or running goal ends FAILED with ``SHUTDOWN`` and the model is freed;
  unconfigured (new goals: REJECTED, ``INACTIVE``). shutdown (from any state): the same,
  then finalized.

Predictors built after the start (``make run`` builds the RLP and the readout in the
background): while active, every ``predictor.reload_check_s`` the node asks
``upgrade_check(service)`` whether files it lacks exist now; if so it builds a second service
with them beside the running one and swaps it in when no goal is queued or running (goals are
served meanwhile), then logs the switch.

The action's mechanics (accept, execute, cancel, end each goal) are ros/action_goals.py's; the
periodic ServerStats and /diagnostics messages ros/diagnostics.py's; running the node
(configure, activate, spin, stop) ros/spin.py's.
"""

import gc
import platform
import time
import traceback

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.lifecycle import LifecycleNode, TransitionCallbackReturn
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

from timebill_ros.msg import GoalEvent, ServerStats
from timebill_ros.ros import diagnostics
from timebill_ros.ros.action_goals import InstructGoals
from timebill_ros.ros.parameters import declare_and_read, read_config
from timebill_ros.ros.spin import freeze_heap
from timebill_ros.server.executor import max_running_goals
from timebill_ros.server.factory import predictor_upgrade
from timebill_ros.server.heap import memory_text, release_free_heap
from timebill_ros.server.service_slot import ServiceSlot
from timebill_ros.server.stats import diagnostic_level

EVENTS_KEPT = 100  # GoalEvents the ~/events publisher keeps for late subscribers
DESTROY_WAIT_S = 5.0  # longest wait in destroy_node() for execute callbacks to return, s
SPARE_THREADS = 4  # executor threads beyond the goals' execute callbacks
SUCCESS, FAILURE = TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.FAILURE


class TimeBillNode(LifecycleNode):
    """Serves Instruct goals with the service built by ``service_factory(config, logger)``.

    Starts unconfigured: ros.spin.bring_up (or ``~/change_state``) configures and activates
    it. ``freeze_heap``: once the service is built, run one full collection and
    ``gc.freeze()`` (ros.spin.freeze_heap); the server process sets it, in-process tests
    leave it off. ``goals`` (ros.action_goals.InstructGoals) serves the action.
    """

    def __init__(self, service_factory, node_name='timebill', freeze_heap=False,
                 upgrade_check=predictor_upgrade, **kwargs):
        super().__init__(node_name, **kwargs)
        self.config = declare_and_read(self)
        self._service_factory = service_factory
        self._freeze_heap = freeze_heap
        # Which service serves, and its hot swap when predictor files appear (server/).
        self.slot = ServiceSlot(service_factory, upgrade_check, self.get_logger().info,
                                self._log_fault, on_swap=self._took_config,
                                on_retired=self._free_retired)
        self.lifecycle_state = 'unconfigured'
        self._destroyed = False
        self._group = ReentrantCallbackGroup()
        # Latched: a monitor that starts late gets the last EVENTS_KEPT goals.
        events_pub = self.create_publisher(GoalEvent, self.config.ros.events_topic, QoSProfile(
            depth=EVENTS_KEPT, durability=DurabilityPolicy.TRANSIENT_LOCAL,
            reliability=ReliabilityPolicy.RELIABLE))
        self.goals = InstructGoals(self, events_pub, self._group, self._log_fault)
        self._stats_pub = self.create_publisher(ServerStats, self.config.ros.stats_topic, 10)
        self._diag_pub = self.create_publisher(DiagnosticArray, '/diagnostics', 10)
        self._hardware_id = f'{platform.node() or "localhost"}/{self.config.engine.device}'
        self.create_timer(self.config.stats.period_s, self._publish_stats,
                          callback_group=self._group)
        if self.config.predictor.reload_check_s > 0:
            self.create_timer(self.config.predictor.reload_check_s, self._check_upgrade,
                              callback_group=self._group)
        self.get_logger().info('unconfigured')

    @property
    def service(self):
        """Return the serving TimeBillService (None while unconfigured)."""
        return self.slot.service

    def _took_config(self, service):
        self.config = service.config

    def _free_retired(self):
        """Collect the service a predictor swap retired, give its heap back, log the memory.

        Configure froze the old service's objects (``freeze_heap``): the collector never
        looks at them, so its reference cycles (and through them its model, KV caches and
        prefix store, ~420 MB in a soak) would stay for good. Unfrozen, collected, then
        frozen again with the new service; the slot's lock holds goals meanwhile (the time
        is in the log line).
        """
        start_s = time.monotonic()
        if self._freeze_heap:
            gc.unfreeze()
            freeze_heap()
        else:
            gc.collect()
        release_free_heap()
        self.get_logger().info(f'memory: {memory_text()} after freeing the old service '
                               f'({time.monotonic() - start_s:.2f} s)')

    @property
    def executor_threads(self):
        """Return the MultiThreadedExecutor size this node needs.

        One thread for each goal that may wait in the queue or run (each execute callback
        holds one until its result), and SPARE_THREADS for goal responses, cancels and timers.
        """
        return self.config.queue.max_depth + max_running_goals(self.config) + SPARE_THREADS

    def _action_name(self):
        return self.resolve_topic_name(self.config.ros.action_name)

    # --- lifecycle -------------------------------------------------------------------------
    def on_configure(self, state):
        """Read the parameters and build the service (model, calibration, predictors)."""
        self.lifecycle_state = 'configuring'
        try:
            self.config = read_config(self)
            service = self._service_factory(self.config, self.get_logger().info)
            service.pause()  # inactive until activated
            if self._freeze_heap:
                freeze_heap()
            service.start()
        except Exception:
            self._log_fault('configure')
            self.lifecycle_state = 'unconfigured'
            return FAILURE
        self.slot.install(service)
        if self.goals.action is None:
            self.goals.open(self.config.ros)
        self.lifecycle_state = 'inactive'
        self.get_logger().info(f'configured (inactive): {self._action_name()} refuses goals '
                               'until activated')
        return SUCCESS

    def on_activate(self, state):
        """Serve goals."""
        self.service.resume()
        self.lifecycle_state = 'active'
        self.slot.active = True
        self.get_logger().info(f'active: serving {self._action_name()}')
        return super().on_activate(state)

    def on_deactivate(self, state):
        """Refuse new goals (INACTIVE); queued and running goals go on to their end."""
        self.slot.active = False
        self.service.pause()
        self.lifecycle_state = 'inactive'
        self.get_logger().info('inactive: new goals are refused; queued and running goals '
                               'go on to their own end')
        return super().on_deactivate(state)

    def on_cleanup(self, state):
        """End every goal (FAILED, SHUTDOWN) and free the model."""
        self._release_service()
        self.get_logger().info('cleaned up (unconfigured): the model is freed')
        return SUCCESS

    def on_shutdown(self, state):
        """End every goal (FAILED, SHUTDOWN) and free the model; the node is finalized."""
        self._release_service()
        self.lifecycle_state = 'finalized'
        return SUCCESS

    def on_error(self, state):
        """Free what a failed transition left; back to unconfigured."""
        self._release_service()
        return SUCCESS

    def _release_service(self):
        """End every goal (FAILED, SHUTDOWN) and free the model; the action server stays."""
        self.slot.active = False
        service = self.slot.release()
        self.lifecycle_state = 'unconfigured'
        if service is None:
            return
        service.shutdown()
        del service
        gc.unfreeze()  # the model's objects were frozen by configure: let them go
        gc.collect()

    def shutdown(self):
        """End all goals (FAILED) and stop the service's threads; calling it again is a no-op.

        A replacement service being built meanwhile is never swapped in (it shuts down).
        """
        service = self.slot.close()
        if service is not None:
            service.shutdown()

    # --- predictors built after the start ----------------------------------------------------
    def _check_upgrade(self):
        """Timer: build a service with predictors that appeared (ServiceSlot.check_upgrade)."""
        try:
            self.slot.check_upgrade(lambda: read_config(self))
        except Exception:
            self._log_fault('predictor check')

    def destroy_node(self):
        """End every goal in flight (FAILED), then destroy the action server and the node.

        Goals' execute callbacks get up to DESTROY_WAIT_S seconds to return, so a client
        whose executor still spins receives their results; no ``timebill-*`` thread is left.
        """
        if self._destroyed:
            return
        self._destroyed = True
        self.shutdown()
        self.goals.close(DESTROY_WAIT_S)
        super().destroy_node()

    def _log_fault(self, where):
        self.get_logger().error(f'{where} failed: {traceback.format_exc()}')

    # --- stats and diagnostics -------------------------------------------------------------
    def _publish_stats(self):
        try:
            self._publish_stats_once()
        except Exception:  # a timer callback that raises would stop the executor's spin
            self._log_fault('stats publishing')

    def _publish_stats_once(self):
        service, state = self.service, self.lifecycle_state
        stamp = self.get_clock().now().to_msg()
        if service is None:  # no goals are served: /diagnostics says so, no stats
            self._publish_diagnostics(stamp, 1, f'{state}: not serving goals',
                                      {'lifecycle_state': state})
            return
        snap, serving = service.stats.snapshot(), service.status()
        self._stats_pub.publish(diagnostics.stats_msg(stamp, snap, serving, self.config.stats))
        level, message = diagnostic_level(snap, self.config.stats)
        if state != 'active':
            level, message = max(level, 1), f'{state}: new goals are refused; {message}'
        values = {'lifecycle_state': state}
        values.update(diagnostics.diagnostic_values(snap, serving, self.config.stats))
        self._publish_diagnostics(stamp, level, message, values)

    def _publish_diagnostics(self, stamp, level, message, values):
        """Publish one /diagnostics status; level: 0 OK, 1 WARN, 2 ERROR."""
        self._diag_pub.publish(diagnostics.diagnostic_array(
            stamp, level, f'{self.get_name()}: deadlines', message, self._hardware_id, values))
